// Who the pages connect as: the credentials of the WebSocket handshake (credentials.py).
//
// A browser cannot set a header on a WebSocket, so the credentials travel as subprotocols
// ("tidings" and "tidings.bearer.<token>" or "tidings.basic.<base64url of user:password>").
// They come from the address's fragment (#token=... or #user=...&password=..., which the
// browser never sends to a server; the page removes it from the address bar at once) or,
// when the server refuses the page without them, from a small form showing the server's
// reason. They are kept in this page only (no storage): a reload asks again.
//
// A browser cannot read why a WebSocket handshake was refused either, so the page first
// asks GET ./auth with the same credentials (as an Authorization header), which answers
// who they prove to be, or the reason of the refusal.

const PROTOCOL = "tidings";

function base64(text, urlsafe) {
  const bytes = new TextEncoder().encode(text);
  const encoded = btoa(String.fromCharCode(...bytes));
  return urlsafe ? encoded.replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "") : encoded;
}

function fromFragment() {
  const params = new URLSearchParams(window.location.hash.slice(1));
  if (params.get("token")) return { token: params.get("token") };
  if (params.get("user")) return { user: params.get("user"), password: params.get("password") ?? "" };
  return null;
}

function authorization(credentials) {
  return credentials.token !== undefined
    ? `Bearer ${credentials.token}`
    : `Basic ${base64(`${credentials.user}:${credentials.password}`, false)}`;
}

// The subprotocols a WebSocket offers to carry the credentials (none: anonymous).
export function subprotocols(credentials) {
  if (!credentials) return [];
  return credentials.token !== undefined
    ? [PROTOCOL, `${PROTOCOL}.bearer.${credentials.token}`]
    : [PROTOCOL, `${PROTOCOL}.basic.${base64(`${credentials.user}:${credentials.password}`, true)}`];
}

async function check(credentials) {
  const headers = credentials ? { Authorization: authorization(credentials) } : {};
  const reply = await fetch("./auth", { headers, cache: "no-store" });
  const body = await reply.json();
  return reply.ok ? { identity: body.identity } : { error: body.error };
}

// A form in `place` asking for a token or a user and password, after `reason`; resolves
// with what was entered.
function ask(place, reason) {
  return new Promise((resolve) => {
    const form = document.createElement("form");
    form.id = "login";
    form.innerHTML =
      '<span class="reason"></span> ' +
      '<input name="token" placeholder="token" autocomplete="off" size="24"> or ' +
      '<input name="user" placeholder="user" autocomplete="username" size="10"> ' +
      '<input name="password" type="password" placeholder="password" ' +
      'autocomplete="current-password" size="10"> <button>connect</button>';
    form.querySelector(".reason").textContent = reason;
    form.onsubmit = (event) => {
      event.preventDefault();
      const data = new FormData(form);
      form.remove();
      resolve(data.get("token")
        ? { token: data.get("token") }
        : { user: data.get("user"), password: data.get("password") });
    };
    place.append(form);
  });
}

// The credentials to connect with and the identity they prove (asking in `place` until the
// server admits them); `state` is told what happens.
export async function signIn(place, state) {
  let credentials = fromFragment();
  if (window.location.hash) {
    history.replaceState(null, "", window.location.pathname + window.location.search);
  }
  for (;;) {
    const answer = await check(credentials);
    if (answer.identity !== undefined) return { credentials, identity: answer.identity };
    state(`refused: ${answer.error}`);
    credentials = await ask(place, answer.error);
  }
}
