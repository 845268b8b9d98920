// The overview refreshes itself at the sampler's pace; nothing else needs a script.
(function () {
  var taken = document.getElementById("taken");
  if (taken && taken.dataset.refresh) {
    setTimeout(function () { location.reload(); }, Number(taken.dataset.refresh) * 1000);
  }
  document.querySelectorAll("a[data-back]").forEach(function (a) {
    a.addEventListener("click", function (e) { e.preventDefault(); history.back(); });
  });
})();
