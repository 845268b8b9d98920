"""The attacks on an intermediary's WebSocket (``tidings intermediary serve``), each an async
function of the :class:`Target` returning what happened to the attacker in a few words.
The shapes the streams part has too (idle and lying connections, malformed requests, TLS
handshakes) are :mod:`.attacks`'; what is the intermediary's own is here: subscription
floods, SQL views built to be expensive, huge regions, subscribers that never read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import hat.event.common as hc
import websockets
from hat.event import eventer

from bench.hostile.attacks import (
    bounded,
    handshake_flood,
    hold_open,
    idle_websockets,
    malformed_requests,
    oversized_ws_header,
    plaintext_to_tls,
    summary,
)

#: The event types the attacks subscribe to and register: ``(*TYPE, ...)``.
TYPE = ("bench", "hostile")
#: How long an attacker waits for one reply.
REPLY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Target:
    """The intermediary under attack, and how the attacker reaches it."""

    url: str
    port: int
    #: Trusts the intermediary's CA: the attacker completes real handshakes.
    tls: ssl.SSLContext
    #: The attacker's token: it is a subscriber granted everything.
    token: str
    #: A user whose password the attacker does not know.
    victim: str
    #: The event server's Eventer (the busy producer registers there).
    eventer: str
    count: int
    hold_s: float
    world: tuple[list[float], list[float]]

    def options(self, **more: Any) -> dict[str, Any]:
        """``websockets.connect`` options: TLS and the attacker's token."""
        headers = {"Authorization": f"Bearer {self.token}"}
        return {"ssl": self.tls, "additional_headers": headers, "max_size": None, **more}


def _named(reply: dict[str, Any]) -> str:
    """A reply in a few words: its op, or its error message with the numbers left out."""
    if reply.get("op") != "error":
        return str(reply.get("op"))
    return "error: " + re.sub(r"\d+", "N", str(reply.get("message")))[:90]


async def _requests(
    ws: Any, requests: list[dict[str, Any]], outcomes: dict[str, int] | None = None
) -> dict[str, int]:
    """Send every request at once, then read a reply each (the server answers in order;
    pushed event and view messages in between are skipped); how they were answered, counted
    into ``outcomes`` as they come (so a connection closed midway leaves its count), the
    close itself counted too."""
    outcomes = {} if outcomes is None else outcomes

    def count(what: str) -> None:
        outcomes[what] = outcomes.get(what, 0) + 1

    try:
        for request in requests:
            await ws.send(json.dumps(request))
        answered = 0
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            while answered < len(requests):
                message = await ws.recv()
                if isinstance(message, bytes):
                    continue
                reply = json.loads(message)
                if reply.get("op") in ("event", "view", "status"):
                    continue
                answered += 1
                count(_named(reply))
    except websockets.ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd else "-"
        reason = str(exc.rcvd.reason)[:40] if exc.rcvd else ""
        count(f"connection closed midway ({code} {reason!r})")
    except TimeoutError:
        count(f"replies still missing after {REPLY_TIMEOUT_S:g} s")
    return outcomes


async def _hello(ws: Any) -> None:
    json.loads(await ws.recv())


class OpenAtOnce:
    """How many of an attack's connections were served (past their hello) at the same
    time, at most: a total over the attack says nothing of the per-address limit, which
    bounds the connections open at once (the floods open theirs 32 at a time, and the
    server closes some midway, giving their seats to later ones)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def opened(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def closed(self) -> None:
        self.now -= 1

    def __str__(self) -> str:
        return f"at most {self.peak} open at once"


async def _closed(ws: Any, counted: OpenAtOnce) -> None:
    """``counted.closed()`` when ``ws`` ends, whoever ends it."""
    with contextlib.suppress(Exception):
        await ws.wait_closed()
    counted.closed()


async def subscribe_flood_one(t: Target) -> str:
    """One connection asks for ``10 x count`` subscriptions at once, each a new key."""
    requests = [
        {"op": "subscribe", "key": f"k{i}", "events": [[*TYPE, "flood", str(i)]]}
        for i in range(10 * t.count)
    ]
    async with websockets.connect(t.url, **t.options()) as ws:
        await _hello(ws)
        return summary(await _requests(ws, requests))


async def subscribe_flood_many(t: Target) -> str:
    """``count / 4`` connections, each asking for 64 subscriptions at once (the default most
    per subscriber), every pattern distinct; held ``hold_s / 2`` s, then closed."""
    sockets: list[Any] = []
    outcomes: dict[str, int] = {}
    counted = OpenAtOnce()
    watching: list[asyncio.Task[None]] = []

    async def one(i: int) -> str:
        ws = await websockets.connect(t.url, **t.options())
        sockets.append(ws)
        await _hello(ws)
        counted.opened()
        watching.append(asyncio.create_task(_closed(ws, counted)))
        requests = [
            {"op": "subscribe", "key": f"k{k}", "events": [[*TYPE, "flood", f"{i}.{k}", "*"]]}
            for k in range(64)
        ]
        await _requests(ws, requests, outcomes)
        return "connected"

    connected = await bounded(max(1, t.count // 4), one)
    await asyncio.sleep(t.hold_s / 2)
    for ws in sockets:
        with contextlib.suppress(Exception):
            await ws.close()
    await asyncio.gather(*watching)
    return f"connections: {summary(connected)}, {counted}; subscriptions: {summary(outcomes)}"


def _cross(tables: int, select: str, tail: str = "") -> str:
    joins = " ".join(f"CROSS JOIN item t{i}" for i in range(1, tables))
    return f"SELECT {select} FROM item t0 {joins} {tail}".strip()


def _nested(depth: int) -> str:
    return "SELECT " + "(" * depth + "t0.n" + " + 1)" * depth + " FROM item t0"


#: SQL views built to be expensive that the view grammar accepts.
EXPENSIVE_VIEWS = {
    "cross3_order": _cross(3, "t0.id, t1.id, t2.id", "ORDER BY t0.n * t1.n - t2.n DESC"),
    "cross8_count": _cross(8, "COUNT(*)"),
    "cross2_like": _cross(2, "t0.id", "WHERE t0.city || t1.city LIKE '%x%y%z%' LIMIT 10000"),
    "group_concat": _cross(2, "GROUP_CONCAT(t0.city || t1.city)"),
    "replace_blowup": "SELECT "
    + "REPLACE(" * 8
    + "t0.city"
    + ", 'c', t0.city || t0.city || t0.city)" * 8
    + " FROM item t0",
    "nested_20": _nested(20),
    "max_limit": _cross(2, "t0.id, t1.id", "LIMIT 10000"),
}
#: Views the grammar refuses.
REFUSED_VIEWS = {
    "limit_1e12": _cross(2, "t0.id", "LIMIT 1000000000000"),
    "cross9": _cross(9, "COUNT(*)"),
    "nested_60": _nested(60),
    "subquery": "SELECT id FROM item WHERE id IN (SELECT id FROM item)",
    "recursive_cte": "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
    "SELECT x FROM r",
    "union": "SELECT id FROM item UNION SELECT n FROM item",
    "randomblob": "SELECT randomblob(1000000000) FROM item",
    "pragma": "PRAGMA table_info(item)",
    "attach": "ATTACH DATABASE '/tmp/x.db' AS x",
    "long_text": "SELECT id FROM item WHERE " + " OR ".join(f"id = {i}" for i in range(3000)),
}


async def _watch_view(t: Target, name: str, sql: str, seconds: float) -> str:
    """Subscribe one view on its own connection and read for ``seconds``: its reply, and
    how many results and errors were pushed."""
    async with websockets.connect(t.url, **t.options()) as ws:
        await _hello(ws)
        await ws.send(json.dumps({"op": "subscribe", "key": name, "sql": sql, "rate_hz": 50}))
        results, errors, first = 0, set(), ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        with contextlib.suppress(TimeoutError):
            while (left := deadline - loop.time()) > 0:
                message = json.loads(await asyncio.wait_for(ws.recv(), left))
                op = message.get("op")
                if op in ("subscribed", "error") and not first:
                    first = _named(message)
                    if op == "error":
                        return f"{name}: refused ({first[7:]})"
                elif op == "view" and "error" in message:
                    errors.add(re.sub(r"\d+", "N", str(message["error"]))[:80])
                elif op == "view" and "rows" in message:
                    results += 1
        shown = f", errors: {'; '.join(sorted(errors))}" if errors else ""
        return f"{name}: {first or 'no reply'}, {results} results{shown}"


async def _change_rows(t: Target, seconds: float, keys: int = 50) -> int:
    """Row changes of table ``item`` every 0.1 s for ``seconds`` (views re-evaluate)."""
    client = await eventer.connect(t.eventer, [])
    changed = 0
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            changed += 1
            key = changed % keys
            row = {"id": key, "n": changed, "city": f"c{changed % 7}"}
            client.register([row_event(key, row)])
            await asyncio.sleep(0.1)
    finally:
        await client.async_close()
    return changed


def row_event(key: int, row: dict[str, Any]) -> hc.RegisterEvent:
    """A row-change event of table ``item`` (:mod:`tidings.intermediary.views.rows`)."""
    return hc.RegisterEvent(
        event_type=("db", "rows.item"),
        source_timestamp=None,
        payload=hc.EventPayload(type=hc.EventPayloadType.JSON, data={"key": key, "row": row}),
    )


async def expensive_views(t: Target) -> str:
    """Each expensive view on its own connection while rows change (so they are evaluated
    again and again), and each refused one."""
    views = {**EXPENSIVE_VIEWS, **REFUSED_VIEWS}
    watching = [_watch_view(t, name, sql, t.hold_s) for name, sql in views.items()]
    changing = _change_rows(t, t.hold_s)
    *outcomes, changed = await asyncio.gather(*watching, changing, return_exceptions=True)
    shown = [o if isinstance(o, str) else f"{type(o).__name__}: {o}"[:120] for o in outcomes]
    return f"{changed} row changes; " + "; ".join(shown)


def _regions(t: Target) -> dict[str, dict[str, Any]]:
    lo, hi = t.world
    return {
        "world_box": {"box": {"lo": lo, "hi": hi}},
        "sphere_1e9": {"sphere": {"center": [0.0, 0.0], "radius": 1e9}},
        "box_1e9": {"box": {"lo": [-1e9, -1e9], "hi": [1e9, 1e9]}},
        "box_1e300": {"box": {"lo": [-1e300, -1e300], "hi": [1e300, 1e300]}},
        "sphere_nan": {"sphere": {"center": [0.0, 0.0], "radius": "NaN"}},
    }


async def _read_frames(ws: Any, seconds: float) -> tuple[int, int]:
    """Frames and bytes read in ``seconds``."""
    frames = size = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    with contextlib.suppress(TimeoutError, websockets.ConnectionClosed):
        while (left := deadline - loop.time()) > 0:
            message = await asyncio.wait_for(ws.recv(), left)
            if isinstance(message, bytes):
                frames += 1
                size += len(message)
    return frames, size


async def huge_regions(t: Target) -> str:
    """``count / 4`` connections, each subscribing to every huge region at 100 Hz (the
    whole world, regions far larger than it, and malformed ones) and reading its frames for
    ``hold_s / 2`` s."""
    outcomes: dict[str, int] = {}
    totals = [0, 0]
    counted = OpenAtOnce()

    async def one(i: int) -> str:
        async with websockets.connect(t.url, **t.options()) as ws:
            await _hello(ws)
            counted.opened()
            closing = asyncio.create_task(_closed(ws, counted))
            requests = [
                {"op": "subscribe", "key": name, "region": region, "rate_hz": 100}
                for name, region in _regions(t).items()
            ]
            await _requests(ws, requests, outcomes)
            frames, size = await _read_frames(ws, t.hold_s / 2)
            totals[0] += frames
            totals[1] += size
        await closing
        return "connected"

    connected = await bounded(max(1, t.count // 4), one)
    return (
        f"connections: {summary(connected)}, {counted}; subscriptions: {summary(outcomes)}; "
        f"{totals[0]:,} frames, {totals[1] / 2**20:.1f} MiB read"
    )


async def _busy(t: Target, events: int, payload: int) -> None:
    """Register ``events`` events of ``(*TYPE, 'busy', n)`` with ``payload``-byte
    payloads, in batches of 500."""
    client = await eventer.connect(t.eventer, [])
    try:
        for start in range(0, events, 500):
            batch = [
                hc.RegisterEvent(
                    event_type=(*TYPE, "busy", str(i % 10)),
                    source_timestamp=None,
                    payload=hc.EventPayload(type=hc.EventPayloadType.JSON, data="x" * payload),
                )
                for i in range(start, min(events, start + 500))
            ]
            await client.register_with_response(batch)
    finally:
        await client.async_close()


async def _drained(ws: Any, seconds: float) -> str:
    """Read what waits until the connection ends (or ``seconds``): how it ended."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            with contextlib.suppress(websockets.ConnectionClosed):
                while True:
                    await ws.recv()
            return f"closed by the server ({ws.close_code} {str(ws.close_reason)[:50]!r})"
    return "still open"


async def never_reading(t: Target) -> str:
    """``count / 4`` connections subscribe to a busy event type and the whole world, then
    never read (their client stops reading the socket after one message); 30,000 events of
    1 KiB are registered meanwhile. Afterwards each is read to see whether the server
    closed it. The connections come from several loopback addresses, at most
    :data:`PER_ADDRESS` from each (a botnet, not one host): the server's limit per address
    would otherwise refuse most of them at accept, and the never-readers it serves are what
    this attack measures."""
    sockets = []
    for i in range(max(1, t.count // 4)):
        source = f"127.0.0.{2 + i // PER_ADDRESS}"
        ws = await websockets.connect(t.url, **t.options(max_queue=1, local_addr=(source, 0)))
        await _hello(ws)
        lo, hi = t.world
        requests: list[dict[str, Any]] = [
            {"op": "subscribe", "key": "busy", "events": [[*TYPE, "busy", "*"]]},
            {"op": "subscribe", "key": "world", "region": {"box": {"lo": lo, "hi": hi}}},
        ]
        await _requests(ws, requests)
        sockets.append(ws)
    await _busy(t, 30_000, 1024)
    await asyncio.sleep(t.hold_s / 2)
    ended: dict[str, int] = {}
    for ws in sockets:
        how = await _drained(ws, 10)
        ended[how] = ended.get(how, 0) + 1
        with contextlib.suppress(Exception):
            await ws.close()
    return f"30,000 busy events; {len(sockets)} never-readers: {summary(ended)}"


#: Connections a many-address attack opens from each address: under the server's default
#: limit per address (100).
PER_ADDRESS = 50


async def bad_passwords(t: Target) -> str:
    """``count`` handshakes with a wrong password (each a scrypt check), 32 at once; each
    waits up to REPLY_TIMEOUT_S for its answer (they queue behind the scrypt checks)."""
    options: dict[str, Any] = {"ssl": t.tls, "open_timeout": REPLY_TIMEOUT_S}

    async def one(i: int) -> str:
        auth = {"Authorization": basic(t.victim, f"wrong{i}")}
        try:
            async with websockets.connect(t.url, additional_headers=auth, **options):
                return "accepted!"
        except websockets.InvalidStatus as exc:
            return f"HTTP {exc.response.status_code}"

    return summary(await bounded(t.count, one))


def basic(user: str, password: str) -> str:
    """An ``Authorization: Basic`` value."""
    import base64

    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def oversized_request(t: Target) -> str:
    """One 1 MiB text request (the default limit is 64 KiB)."""
    async with websockets.connect(t.url, **t.options()) as ws:
        await _hello(ws)
        with contextlib.suppress(websockets.ConnectionClosed):
            await ws.send("x" * (1 << 20))
        return await _drained(ws, 30)


def _malformed(i: int) -> str | bytes:
    kinds: list[str | bytes] = [
        "not json",
        "[" * 20000 + "]" * 20000,
        json.dumps([1, 2, 3]),
        json.dumps({"op": "nonsense"}),
        json.dumps({"op": "subscribe", "key": "k", "region": {"box": {"lo": [0], "hi": "x"}}}),
        json.dumps({"op": "subscribe", "key": "k" * 10_000, "events": [["a"]]}),
        b"\x00\xff" * 100,
    ]
    return kinds[i % len(kinds)]


def _answer(reply: Any) -> str:
    return _named(reply) if isinstance(reply, dict) else "not an object"


def intermediary_attacks(t: Target) -> dict[str, Callable[[], Awaitable[str]]]:
    """Every attack on ``t``, by name (the order of ATTACKS)."""
    every: dict[str, Callable[[], Awaitable[str]]] = {
        "subscribe_flood_one": lambda: subscribe_flood_one(t),
        "subscribe_flood_many": lambda: subscribe_flood_many(t),
        "expensive_views": lambda: expensive_views(t),
        "huge_regions": lambda: huge_regions(t),
        "never_reading": lambda: never_reading(t),
        "bad_passwords": lambda: bad_passwords(t),
        "idle_tcp": lambda: hold_open(t.port, t.count, t.hold_s),
        "idle_websockets": lambda: idle_websockets(t.url, t.count, t.hold_s, **t.options()),
        "oversized_ws": lambda: oversized_ws_header(t.url, **t.options()),
        "oversized_request": lambda: oversized_request(t),
        "malformed_ws": lambda: malformed_requests(
            t.url, [_malformed(i) for i in range(t.count)], _answer, True, **t.options()
        ),
        "tls_handshakes": lambda: handshake_flood(t.port, t.tls, t.count),
        "tls_plaintext": lambda: plaintext_to_tls(t.port, b"GET / HTTP/1.1\r\n\r\n", t.count),
    }
    return every


#: name -> what the attacker does.
ATTACKS: dict[str, str] = {
    "subscribe_flood_one": "one connection asks for 10 x N subscriptions at once",
    "subscribe_flood_many": "N/4 connections, 64 distinct event subscriptions each at once",
    "expensive_views": "SQL views built to be expensive (cross joins of 2-8 tables, deep "
    "nesting, the highest LIMIT, string blow-ups) while rows change, and views refused",
    "huge_regions": "N/4 connections, each the whole world and regions up to 1e9 (and "
    "beyond, and NaN) at 100 Hz",
    "never_reading": "N/4 connections (50 per address) on a busy type and the whole world "
    "that never read, 30,000 events of 1 KiB",
    "bad_passwords": "handshakes with wrong passwords, 32 at once",
    "idle_tcp": "TCP connections to the TLS port, never a ClientHello",
    "idle_websockets": "authenticated WebSockets that never send or read",
    "oversized_ws": "a WebSocket frame declaring 2^40 bytes",
    "oversized_request": "one 1 MiB request (limit 64 KiB)",
    "malformed_ws": "malformed requests on one WebSocket (40 KB nesting among them)",
    "tls_handshakes": "full TLS handshakes, 32 at once",
    "tls_plaintext": "plaintext HTTP to the TLS port",
}
