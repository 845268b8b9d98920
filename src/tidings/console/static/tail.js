// The live tail: an EventSource on /tail/stream; rows are built with textContent only.
(function () {
  var form = document.getElementById("tail-form");
  if (!form) { return; }
  var table = document.getElementById("tail");
  var payload = document.getElementById("tail-payload");
  var state = document.getElementById("tail-state");
  var pause = document.getElementById("pause");
  var source = null, paused = false, held = [], MAX_ROWS = 500;

  function show(item) {
    var row = table.insertRow(1);
    row.dataset.position = item.position;
    [item.position, item.event_type, item.at, item.key, item.event_id].forEach(function (v) {
      row.insertCell().textContent = v;
    });
    row.addEventListener("click", function () { payload.textContent = item.payload; });
    while (table.rows.length > MAX_ROWS + 1) { table.deleteRow(table.rows.length - 1); }
  }

  form.addEventListener("submit", function (e) {
    e.preventDefault();
    if (source) { source.close(); }
    var query = new URLSearchParams(new FormData(form)).toString();
    source = new EventSource("/tail/stream?" + query);
    source.onopen = function () { state.textContent = "following"; };
    source.onmessage = function (m) {
      var item = JSON.parse(m.data);
      if (paused) { held.push(item); state.textContent = "paused (" + held.length + " waiting)"; }
      else { show(item); }
    };
    source.addEventListener("problem", function (m) { state.textContent = "cannot read: " + JSON.parse(m.data); });
    source.addEventListener("end", function () { source.close(); state.textContent = "ended: log in again"; });
    source.onerror = function () { if (source.readyState === EventSource.CLOSED) { state.textContent = "stopped"; } };
    pause.disabled = false;
  });

  pause.addEventListener("click", function () {
    paused = !paused;
    pause.textContent = paused ? "Resume" : "Pause";
    if (!paused) { held.forEach(show); held = []; state.textContent = "following"; }
    else { state.textContent = "paused"; }
  });
})();
