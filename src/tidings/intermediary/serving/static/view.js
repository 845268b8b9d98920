// One subscriber's live view of a tidings intermediary, drawn as a moving map.
//
// The query string is the subscription (page.py lists the parameters). The protocol is
// transport.py's: the server says hello, the page sends one subscribe request and gets
// "subscribed" or {"op": "error", "message"}; then binary messages arrive, each one byte of
// key length, the key and a frame (README "The binary frame", generation.py): a 36-byte
// header (magic "TDGF", version 2, kind, epoch u64, count u32, dim u8, flags u8, the
// publisher's tick u64 and its wall-clock time f64 in Unix seconds), the
// float64 origin of relative frames, then `count` int64 ids and `count * dim` float32 or
// float64 positions, zlib-compressed as a whole when flagged. All little-endian.
//
// It connects as whom the credentials in its address's fragment prove (#token=... or
// #user=...&password=...), else anonymously, else as what the form it then shows is given
// (auth.js).
//
// window.tidingsView holds what the page shows (the last frame, the error, the close
// reason, the projection last drawn with, the identity), for the console and the tests.

import { signIn, subprotocols } from "./auth.js";

const KEY = "view";
const HEADER_BYTES = 36;
const VERSION = 2;
const KINDS = { 1: "VIEW", 2: "EMPTY", 3: "UNCHANGED" };
const FLAG_FLOAT32 = 1;
const FLAG_RELATIVE = 2;
const FLAG_COMPRESSED = 4;
const FLAG_TRUNCATED = 8;
const KNOWN_FLAGS = FLAG_FLOAT32 | FLAG_RELATIVE | FLAG_COMPRESSED | FLAG_TRUNCATED;
const PARAMETERS = [
  "box",
  "sphere",
  "relative_to",
  "rate_hz",
  "priority",
  "float32",
  "compress",
  "max_entities",
];
const MANY_ENTITIES = 2000;
const COLOURS = {
  background: "#0b1020",
  grid: "#1c2540",
  region: "#3b4a78",
  entity: "#4fd1c5",
  own: "#f6ad55",
};

const statusLine = document.getElementById("status");
const errorLine = document.getElementById("error");
const canvas = document.getElementById("map");

const view = {
  state: "loading",
  request: null, // the subscribe request sent
  last: null, // {kind, epoch, dim, tick, tickTime, ids, positions (flat), origin, truncated}
  frames: 0,
  error: null,
  closed: null, // {code, reason}
  project: null, // (x, y) in the frame's coordinates -> canvas pixel, as last drawn
  colours: COLOURS,
  identity: null, // who the server admitted the page as
};
window.tidingsView = view;
const arrivals = []; // times of the frames of the last second

// --- the subscription, from the query string ------------------------------------------

// A number if the text is one, else the text itself: the server validates, and its message
// then names what was wrong.
function scalar(text) {
  const number = Number(text);
  return text.trim() !== "" && Number.isFinite(number) ? number : text;
}

function numbers(text) {
  return text.split(",").map(scalar);
}

function flag(params, name, otherwise) {
  const text = params.get(name);
  if (text === null) return otherwise;
  return { 1: true, true: true, 0: false, false: false }[text] ?? text;
}

// The subscribe request for `params`, given the server's {dim, world}.
function subscription(params, defaults) {
  const unknown = [...params.keys()].filter((name) => !PARAMETERS.includes(name));
  if (unknown.length > 0) {
    throw new Error(`unknown parameter '${unknown[0]}' (known: ${PARAMETERS.join(", ")})`);
  }
  const region = {};
  const relativeTo = params.get("relative_to");
  if (params.has("box")) {
    const values = numbers(params.get("box"));
    const half = Math.floor(values.length / 2);
    region.box = { lo: values.slice(0, half), hi: values.slice(half) };
  }
  if (params.has("sphere")) {
    const values = numbers(params.get("sphere"));
    region.sphere = { radius: values[values.length - 1] };
    if (values.length > 1 || relativeTo === null) region.sphere.center = values.slice(0, -1);
  }
  if (relativeTo !== null) {
    region.relative_to = /^[0-9]+$/.test(relativeTo) ? Number(relativeTo) : relativeTo;
    if (!region.box && !region.sphere) {
      // Around the entity: a fifth of the world's smallest side, or 20 units.
      const sides = defaults.world ? defaults.world.hi.map((hi, i) => hi - defaults.world.lo[i]) : [];
      region.sphere = { radius: sides.length ? Math.min(...sides) / 5 : 20 };
    }
    if (region.sphere && !region.sphere.center) region.dim = defaults.dim;
  }
  if (!region.box && !region.sphere) {
    if (!defaults.world) {
      throw new Error("this intermediary has no world box: give a region, e.g. ?box=0,0,100,100");
    }
    region.box = defaults.world;
  }
  const capabilities = {
    float32: flag(params, "float32", true),
    compress: flag(params, "compress", false),
    relative: relativeTo !== null,
  };
  if (params.has("max_entities")) capabilities.max_entities = scalar(params.get("max_entities"));
  return {
    op: "subscribe",
    key: KEY,
    region,
    priority: scalar(params.get("priority") ?? "0"),
    rate_hz: scalar(params.get("rate_hz") ?? "10"),
    capabilities,
  };
}

// The rectangle to draw, [x0, y0, x1, y1] in the frame's coordinates (offsets from the
// subscriber's entity when relative): the region's bounding box on the first two axes.
function extent(region) {
  if (region.box) return [region.box.lo[0], region.box.lo[1], region.box.hi[0], region.box.hi[1]];
  const [x, y] = region.sphere.center ?? [0, 0];
  const r = region.sphere.radius;
  return [x - r, y - r, x + r, y + r];
}

// --- decoding -------------------------------------------------------------------------

// One binary message -> {key, kind, epoch, dim, tick, tickTime, ids, positions, origin,
// truncated}.
async function decode(buffer) {
  const bytes = new Uint8Array(buffer);
  if (bytes.length === 0 || bytes.length < 1 + bytes[0]) {
    throw new Error("frame: message shorter than its key");
  }
  const key = new TextDecoder().decode(bytes.subarray(1, 1 + bytes[0]));
  const start = 1 + bytes[0];
  if (bytes.length < start + HEADER_BYTES) throw new Error("frame: shorter than its header");
  const header = new DataView(buffer, start, HEADER_BYTES);
  const magic = String.fromCharCode(...bytes.subarray(start, start + 4));
  if (magic !== "TDGF") throw new Error(`frame: bad magic ${JSON.stringify(magic)}`);
  if (header.getUint8(4) !== VERSION) throw new Error(`frame: unknown version ${header.getUint8(4)}`);
  const kind = KINDS[header.getUint8(5)];
  if (!kind) throw new Error(`frame: unknown kind ${header.getUint8(5)}`);
  const frame = {
    key,
    kind,
    epoch: Number(header.getBigUint64(6, true)),
    dim: header.getUint8(18),
    tick: Number(header.getBigUint64(20, true)),
    tickTime: header.getFloat64(28, true),
    ids: [],
    positions: new Float64Array(0),
    origin: null,
    truncated: false,
  };
  const count = header.getUint32(14, true);
  const flags = header.getUint8(19);
  if (frame.dim !== 2 && frame.dim !== 3) throw new Error(`frame: dim ${frame.dim}`);
  if (flags & ~KNOWN_FLAGS) throw new Error(`frame: unknown flags ${flags}`);
  frame.truncated = Boolean(flags & FLAG_TRUNCATED);
  if (kind !== "VIEW") return frame;
  let offset = start + HEADER_BYTES;
  if (flags & FLAG_RELATIVE) {
    if (bytes.length < offset + 8 * frame.dim) throw new Error("frame: shorter than its origin");
    frame.origin = Array.from(new Float64Array(buffer.slice(offset, offset + 8 * frame.dim)));
    offset += 8 * frame.dim;
  }
  const width = flags & FLAG_FLOAT32 ? 4 : 8;
  const size = count * (8 + frame.dim * width);
  let payload = buffer.slice(offset); // a copy starting at 0: typed arrays need alignment
  if (flags & FLAG_COMPRESSED) payload = await inflate(payload, size);
  if (payload.byteLength !== size) {
    throw new Error(`frame: payload of ${payload.byteLength} bytes, expected ${size}`);
  }
  frame.ids = Array.from(new BigInt64Array(payload, 0, count), Number);
  const Positions = width === 4 ? Float32Array : Float64Array;
  frame.positions = new Positions(payload, 8 * count, count * frame.dim);
  return frame;
}

// zlib-inflate `payload` into exactly `size` bytes; more is refused as soon as it shows, so
// a bad frame cannot take the page's memory.
async function inflate(payload, size) {
  const reader = new Blob([payload])
    .stream()
    .pipeThrough(new DecompressionStream("deflate"))
    .getReader();
  const out = new Uint8Array(size);
  let length = 0;
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (err) {
      throw new Error(`frame: bad zlib payload (${err.message})`);
    }
    if (chunk.done) break;
    if (length + chunk.value.length > size) {
      reader.cancel();
      throw new Error(`frame: payload inflates beyond the announced ${size} bytes`);
    }
    out.set(chunk.value, length);
    length += chunk.value.length;
  }
  return out.buffer.slice(0, length);
}

// --- drawing --------------------------------------------------------------------------

// A round grid step near `span / 8`: 1, 2 or 5 times a power of ten.
function gridStep(span) {
  const rough = span / 8;
  const power = 10 ** Math.floor(Math.log10(rough));
  return [1, 2, 5, 10].map((m) => m * power).find((step) => step >= rough);
}

function draw(frame) {
  const ratio = window.devicePixelRatio || 1;
  const width = Math.round(canvas.clientWidth * ratio);
  const height = Math.round(canvas.clientHeight * ratio);
  if (canvas.width !== width || canvas.height !== height) {
    canvas.width = width;
    canvas.height = height;
  }
  const [x0, y0, x1, y1] = extent(view.request.region);
  const margin = 12 * ratio;
  const scale = Math.min((width - 2 * margin) / (x1 - x0), (height - 2 * margin) / (y1 - y0));
  const project = (x, y) => [
    width / 2 + (x - (x0 + x1) / 2) * scale,
    height / 2 - (y - (y0 + y1) / 2) * scale,
  ];
  view.project = project;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = COLOURS.background;
  ctx.fillRect(0, 0, width, height);

  // Grid lines at round world coordinates: in a relative view they slide as the entity moves.
  const [ox, oy] = frame.origin ?? [0, 0];
  const step = gridStep(Math.max(x1 - x0, y1 - y0));
  ctx.strokeStyle = COLOURS.grid;
  ctx.lineWidth = ratio;
  ctx.beginPath();
  for (let x = Math.ceil((x0 + ox) / step) * step - ox; x <= x1; x += step) {
    ctx.moveTo(...project(x, y0));
    ctx.lineTo(...project(x, y1));
  }
  for (let y = Math.ceil((y0 + oy) / step) * step - oy; y <= y1; y += step) {
    ctx.moveTo(...project(x0, y));
    ctx.lineTo(...project(x1, y));
  }
  ctx.stroke();

  const region = view.request.region;
  ctx.strokeStyle = COLOURS.region;
  ctx.lineWidth = 2 * ratio;
  ctx.beginPath();
  if (region.box) {
    const [left, top] = project(x0, y1);
    ctx.rect(left, top, (x1 - x0) * scale, (y1 - y0) * scale);
  } else {
    ctx.arc(...project((x0 + x1) / 2, (y0 + y1) / 2), region.sphere.radius * scale, 0, 2 * Math.PI);
  }
  ctx.stroke();

  if (frame.origin) {
    // The subscriber's own entity, at the origin of a relative frame: a ring under the dots.
    ctx.strokeStyle = COLOURS.own;
    ctx.beginPath();
    ctx.arc(...project(0, 0), 8 * ratio, 0, 2 * Math.PI);
    ctx.stroke();
  }

  ctx.fillStyle = COLOURS.entity;
  // Dots; squares when there are many (a circle each costs too much for tens of thousands).
  const many = frame.ids.length > MANY_ENTITIES;
  const r = (many ? 1 : 3) * ratio;
  ctx.beginPath();
  for (let i = 0; i < frame.ids.length; i++) {
    const [px, py] = project(frame.positions[i * frame.dim], frame.positions[i * frame.dim + 1]);
    if (many) {
      ctx.rect(px - r, py - r, 2 * r, 2 * r);
    } else {
      ctx.moveTo(px + r, py);
      ctx.arc(px, py, r, 0, 2 * Math.PI);
    }
  }
  ctx.fill();
}

// --- status ---------------------------------------------------------------------------

function showStatus() {
  const now = performance.now();
  while (arrivals.length > 0 && arrivals[0] < now - 1000) arrivals.shift();
  const parts = [view.state];
  const last = view.last;
  if (last) {
    parts.push(`epoch ${last.epoch}`, `${last.ids.length} entities`);
    if (last.truncated) parts.push("truncated");
    // The publisher's clock is this machine's only when they share one: shown as given.
    if (last.tickTime > 0) parts.push(`${Math.round(Date.now() - last.tickTime * 1000)} ms old`);
    if (last.origin) {
      const at = last.origin.map((v) => v.toFixed(1)).join(", ");
      parts.push(`around ${view.request.region.relative_to} at (${at})`);
    }
  }
  parts.push(`${arrivals.length} frames/s`);
  statusLine.textContent = parts.join(" · ");
}

function setState(state) {
  view.state = state;
  showStatus();
}

function showError(message) {
  view.error = message;
  errorLine.textContent = `error: ${message}`;
}

// --- the connection -------------------------------------------------------------------

function show(frame) {
  if (frame.key !== KEY) return;
  view.frames += 1;
  arrivals.push(performance.now());
  // UNCHANGED: the same entities as the previous frame, at a newer epoch.
  view.last = frame.kind === "UNCHANGED" && view.last ? { ...view.last, epoch: frame.epoch, tick: frame.tick, tickTime: frame.tickTime } : frame;
  draw(view.last);
  showStatus();
}

function onText(socket, message) {
  if (message.op === "hello") {
    setState(`subscriber ${message.subscriber} (${message.identity}), subscribing`);
    socket.send(JSON.stringify(view.request));
  } else if (message.op === "subscribed") {
    setState("live");
  } else if (message.op === "error") {
    setState("refused");
    showError(message.message);
  }
}

async function start() {
  const params = new URLSearchParams(window.location.search);
  try {
    const reply = await fetch("./view.json");
    view.request = subscription(params, await reply.json());
  } catch (err) {
    setState("not connected");
    showError(err.message);
    return;
  }
  const { credentials, identity } = await signIn(document.querySelector("header"), setState);
  view.identity = identity;
  const url = new URL("./", window.location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  url.hash = "";
  const socket = new WebSocket(url, subprotocols(credentials));
  socket.binaryType = "arraybuffer";
  setState("connecting");
  // Frames are decoded one after another, in order (inflating is asynchronous).
  let decoded = Promise.resolve();
  socket.onmessage = (event) => {
    if (typeof event.data === "string") {
      onText(socket, JSON.parse(event.data));
      return;
    }
    decoded = decoded
      .then(() => decode(event.data))
      .then(show)
      .catch((err) => showError(err.message));
  };
  socket.onclose = (event) => {
    view.closed = { code: event.code, reason: event.reason };
    const why = `closed (${event.code}${event.reason ? ` ${event.reason}` : ""})`;
    setState(why);
    if (event.code !== 1000) showError(`the connection ${why}`);
  };
  setInterval(showStatus, 500); // frames/s falls to 0 when frames stop
}

start().catch((err) => showError(err.message));
