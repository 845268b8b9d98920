// Event and SQL-view subscriptions of a tidings intermediary, shown as they arrive.
//
// The query string lists the subscriptions, each as many times as wanted:
//   ?events=app/orders/*,app/users/*   one event subscription: Hat patterns, segments joined
//                                      by "/", several patterns by ","
//   ?sql=SELECT ...                    one SQL view (&rate_hz= and &priority= apply to all)
// The protocol is transport.py's: the server says hello; the page sends one subscribe
// request per panel (keys "events1", "sql1", ...) and gets "subscribed" or an error; then
// JSON messages arrive: {"op": "event", "key", "id", "type", "timestamp", "payload"} (newest
// first in the list, the last MAX_EVENTS kept) and {"op": "view", "key", "epoch", "columns",
// "rows"} (the table replaced), {"op": "view", "unchanged": true} or {"op": "view", "error"}.
//
// It connects as whom the credentials in its address's fragment prove (#token=... or
// #user=...&password=...), else anonymously, else as what the form it then shows is given
// (auth.js).
//
// window.tidingsLive holds what the page shows, for the console and the tests.

import { signIn, subprotocols } from "./auth.js";

const MAX_EVENTS = 200;

const statusLine = document.getElementById("status");
const errorLine = document.getElementById("error");
const panelsBox = document.getElementById("panels");

const live = { state: "loading", panels: {}, error: null, closed: null, identity: null };
window.tidingsLive = live;

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function cell(value) {
  return value === null ? "NULL" : typeof value === "object" ? JSON.stringify(value) : String(value);
}

// The subscribe requests of the query string, each with a panel to show it in.
function panels(params) {
  const made = [];
  const rate = params.get("rate_hz");
  const priority = params.get("priority");
  params.getAll("events").forEach((text, i) => {
    const patterns = text.split(",").filter((p) => p !== "").map((p) => p.split("/"));
    made.push({ key: `events${i + 1}`, title: `events ${text}`,
                request: { op: "subscribe", key: `events${i + 1}`, events: patterns } });
  });
  params.getAll("sql").forEach((text, i) => {
    const request = { op: "subscribe", key: `sql${i + 1}`, sql: text };
    if (rate !== null) request.rate_hz = Number(rate);
    if (priority !== null) request.priority = Number(priority);
    made.push({ key: `sql${i + 1}`, title: text, request });
  });
  return made;
}

function addPanel(spec) {
  const section = element("section");
  section.append(element("h2", spec.title), element("div", "subscribing", "state"));
  const body = spec.request.sql !== undefined ? element("table") : element("ol");
  section.append(body);
  panelsBox.append(section);
  const panel = { ...spec, section, body, state: section.querySelector(".state"),
                  events: [], columns: null, rows: null, epoch: null, error: null };
  live.panels[spec.key] = panel;
  return panel;
}

function showEvent(panel, message) {
  panel.events.unshift(message);
  panel.events.length = Math.min(panel.events.length, MAX_EVENTS);
  const item = element("li");
  const payload = message.payload !== undefined ? message.payload : message.payload_base64;
  item.append(element("code", message.type.join("/")), ` ${cell(payload ?? null)}`);
  panel.body.prepend(item);
  while (panel.body.children.length > MAX_EVENTS) panel.body.lastChild.remove();
  panel.state.textContent = `${panel.events.length} events (newest first)`;
}

function showView(panel, message) {
  if (message.unchanged) return;
  if (message.error !== undefined) {
    panel.error = message.error;
    panel.state.textContent = message.error;
    panel.state.className = "state error";
    return;
  }
  Object.assign(panel, { columns: message.columns, rows: message.rows, epoch: message.epoch,
                         error: null });
  const head = element("tr");
  message.columns.forEach((c) => head.append(element("th", c)));
  const rows = message.rows.map((row) => {
    const tr = element("tr");
    row.forEach((v) => tr.append(element("td", cell(v))));
    return tr;
  });
  panel.body.replaceChildren(head, ...rows);
  panel.state.className = "state";
  panel.state.textContent = `${message.rows.length} rows at epoch ${message.epoch}`;
}

function fail(text) {
  live.error = text;
  errorLine.textContent = text;
}

async function start() {
  const specs = panels(new URLSearchParams(location.search));
  if (specs.length === 0) {
    live.state = "idle";
    statusLine.textContent = "add ?events=app/* or ?sql=SELECT ... to the address";
    return;
  }
  const made = specs.map(addPanel);
  const refused = (text) => { live.state = "refused"; statusLine.textContent = text; };
  const { credentials, identity } = await signIn(document.querySelector("header"), refused);
  live.identity = identity;
  const socket = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/`,
                               subprotocols(credentials));
  const pending = []; // panels waiting for their reply, in the order of the requests
  socket.onmessage = (event) => {
    const message = JSON.parse(event.data);
    const panel = live.panels[message.key];
    if (message.op === "hello") {
      live.state = "subscribing";
      statusLine.textContent = `subscriber ${message.subscriber} (${message.identity})`;
      made.forEach((p) => { pending.push(p); socket.send(JSON.stringify(p.request)); });
    } else if (message.op === "subscribed" || message.op === "error" && pending.length) {
      const asked = pending.shift();
      if (message.op === "error") {
        asked.error = message.message;
        asked.state.textContent = message.message;
        asked.state.className = "state error";
      } else {
        asked.state.textContent = "subscribed";
      }
      if (pending.length === 0) live.state = "live";
    } else if (message.op === "event" && panel) {
      showEvent(panel, message);
    } else if (message.op === "view" && panel) {
      showView(panel, message);
    } else if (message.op === "error") {
      fail(message.message);
    }
  };
  socket.onclose = (event) => {
    live.state = "closed";
    live.closed = { code: event.code, reason: event.reason };
    fail(`connection closed (${event.code}${event.reason ? `: ${event.reason}` : ""})`);
  };
}

start().catch((err) => fail(err.message));
