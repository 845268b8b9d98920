"""The attacks: the shapes both parts use (floods, idle and slow connections, lying and
malformed WebSocket frames, TLS handshakes; each an async function returning what happened to
the attacker in a few words), and the streams part's attacks built from them. Raw sockets
where the attack is below what a client library would send (slowloris, lying frame headers,
plaintext to a TLS port: :mod:`bench.harness.sockets`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import websockets

from bench.harness.sockets import SLOW_HEAD, closed_count, closed_within, open_many, trickle
from bench.server.hostile import frame

#: Attacks running at once, at most, in the floods.
CONCURRENCY = 32


@dataclass(frozen=True)
class Target:
    """The server under attack."""

    stream_port: int
    stream_url: str
    eventer_port: int
    #: Trusts the server's CA: the attacker completes real handshakes.
    client_tls: ssl.SSLContext
    sec: str
    #: How many connections or requests an attack makes.
    count: int
    #: How long the slow and idle attacks hold their connections.
    hold_s: float

    @property
    def ws_url(self) -> str:
        return self.stream_url.replace("http", "ws")


# -- the shapes both parts use ---------------------------------------------------------------


async def bounded(count: int, one: Callable[[int], Awaitable[str]]) -> dict[str, int]:
    """Run ``one`` ``count`` times, CONCURRENCY at once; how many ended each way."""
    outcomes: dict[str, int] = {}
    semaphore = asyncio.Semaphore(CONCURRENCY)

    async def run(i: int) -> None:
        async with semaphore:
            try:
                outcome = await one(i)
            except Exception as exc:
                outcome = type(exc).__name__
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

    await asyncio.gather(*(run(i) for i in range(count)))
    return outcomes


def summary(outcomes: dict[str, int]) -> str:
    """``1,234 what, 56 other``: the most frequent first."""
    return ", ".join(f"{n:,} {what}" for what, n in sorted(outcomes.items(), key=lambda x: -x[1]))


async def hold_open(
    port: int,
    count: int,
    hold_s: float,
    tls: ssl.SSLContext | None = None,
    slow: bool = False,
) -> str:
    """``count`` connections that never send a byte (or, ``slow``, an HTTP head one header
    a second), held ``hold_s`` s; how many the server closed meanwhile."""
    opened = await open_many(port, count, tls, SLOW_HEAD if slow else b"")
    if slow:
        await trickle([writer for _, writer in opened], 1.0, hold_s)
    else:
        await asyncio.sleep(hold_s)
    closed = await closed_count(opened)
    return f"{len(opened):,} opened, {closed:,} closed by the server within {hold_s:g} s"


async def idle_websockets(url: str, count: int, hold_s: float, **options: Any) -> str:
    """``count`` opened WebSockets that never send a request (nor read); ``options`` go to
    ``websockets.connect`` (TLS, credentials)."""
    sockets = []
    for _ in range(count):
        with contextlib.suppress(Exception):
            sockets.append(await websockets.connect(url, **options))
    await asyncio.sleep(hold_s)
    open_now = sum(ws.state.name == "OPEN" for ws in sockets)
    for ws in sockets:
        with contextlib.suppress(Exception):
            await ws.close()
    closed = len(sockets) - open_now
    return f"{len(sockets):,} opened, {closed:,} closed by the server within {hold_s:g} s"


async def oversized_ws_header(url: str, **options: Any) -> str:
    """A WebSocket frame whose header declares 2^40 bytes, then a trickle of them."""
    async with websockets.connect(url, **options) as ws:
        transport = ws.transport
        # FIN, text; masked, 127: a 64-bit length follows; then the mask.
        transport.write(b"\x81\xff" + (1 << 40).to_bytes(8, "big") + b"\0\0\0\0" + b"a" * 65536)
        try:
            async with asyncio.timeout(30):
                await ws.wait_closed()
        except TimeoutError:
            return "still open after 30 s"
        return f"closed by the server: {ws.close_code} {ws.close_reason!r}"


async def malformed_requests(
    url: str,
    messages: list[str | bytes],
    answer: Callable[[Any], str],
    greeting: bool = False,
    **options: Any,
) -> str:
    """Each of ``messages`` on a WebSocket, answered before the next (``answer`` names the
    reply); a new WebSocket whenever the server closed one (counted). ``greeting``: the
    server speaks first on a new WebSocket (its message is read and left out)."""
    outcomes: dict[str, int] = {}

    async def connect() -> Any:
        ws = await websockets.connect(url, **options)
        if greeting:
            await ws.recv()
        return ws

    ws = await connect()
    try:
        for message in messages:
            try:
                await ws.send(message)
                async with asyncio.timeout(30):
                    reply = json.loads(await ws.recv())
                outcome = answer(reply)
            except TimeoutError:
                outcome = "no answer in 30 s"
            except websockets.ConnectionClosed as exc:
                outcome = f"WebSocket closed ({exc.rcvd.code if exc.rcvd else '-'})"
                ws = await connect()
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        await ws.close()
    return summary(outcomes)


async def handshake_flood(port: int, tls: ssl.SSLContext, count: int) -> str:
    """``count`` full TLS handshakes, CONCURRENCY at once, each closed at once."""

    async def one(i: int) -> str:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
        writer.close()
        return "handshakes"

    return summary(await bounded(count, one))


async def plaintext_to_tls(port: int, data: bytes, count: int) -> str:
    """``count`` connections sending ``data`` in plaintext to a TLS port."""

    async def one(_: int) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        closed = await closed_within(reader, 30)
        writer.close()
        return "closed by the server" if closed else "still open after 30 s"

    return summary(await bounded(count, one))


# -- the streams' attacks --------------------------------------------------------------------


async def bad_passwords(target: Target) -> str:
    """``count`` POSTs with a wrong password (each a full scrypt check on the server)."""
    user = target.sec.partition(":")[0]
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(i: int) -> str:
            request = {
                "f": "futoin.evt.poll:1.1:pollEvents",
                "p": {"component": "X"},
                "sec": f"{user}:wrong{i}",
            }
            reply = await client.post(target.stream_url, content=json.dumps(request))
            return str(reply.json().get("e", "accepted!"))

        return summary(await bounded(target.count, one))


async def oversized_http(target: Target) -> str:
    """One POST of 32 MiB (the stream's limit is 64 KiB)."""
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=120) as client:
        try:
            reply = await client.post(target.stream_url, content=b"[" * (32 << 20))
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__} after {time.perf_counter() - started:.2f} s"
    return (
        f"HTTP {reply.status_code} {reply.text[:80]!r} after {time.perf_counter() - started:.2f} s"
    )


def _malformed(i: int) -> str:
    kinds = [
        "not json",
        "[" * 20000 + "]" * 20000,  # the deep nesting
        json.dumps({"f": "futoin.evt.poll:1.1:pollEvents", "p": [], "rid": "C1"}),
        json.dumps({"f": "nonsense", "rid": "C1"}),
        "\x00\xff" * 100,
    ]
    return kinds[i % len(kinds)]


def _ftn3_answer(reply: Any) -> str:
    return str(reply.get("e", "answered"))


def _stream_attacks(t: Target) -> dict[str, Callable[[], Awaitable[str]]]:
    return {
        "bad_passwords": lambda: bad_passwords(t),
        "slowloris": lambda: hold_open(t.stream_port, t.count, t.hold_s, slow=True),
        "idle_tcp": lambda: hold_open(t.stream_port, t.count, t.hold_s),
        "idle_websockets": lambda: idle_websockets(t.ws_url, t.count, t.hold_s),
        "oversized_http": lambda: oversized_http(t),
        "oversized_ws": lambda: oversized_ws_header(t.ws_url),
        "malformed_ws": lambda: malformed_requests(
            t.ws_url, [_malformed(i) for i in range(t.count)], _ftn3_answer
        ),
        "tls_handshakes": lambda: handshake_flood(t.eventer_port, t.client_tls, t.count),
        "tls_plaintext": lambda: plaintext_to_tls(
            t.eventer_port, frame("MsgSubscribe", b"\x80"), t.count
        ),
        "tls_silent": lambda: hold_open(t.eventer_port, t.count, t.hold_s),
    }


def stream_attacks(target: Target, only: list[str]) -> dict[str, Callable[[], Awaitable[str]]]:
    """The attacks on ``target`` named in ``only`` (none named: all), in ATTACKS' order."""
    every = _stream_attacks(target)
    return {name: every[name] for name in ATTACKS if not only or name in only}


#: name -> what the attacker does.
ATTACKS: dict[str, str] = {
    "bad_passwords": "POSTs with wrong passwords, 32 at once",
    "slowloris": "HTTP heads sent one header a second",
    "idle_tcp": "TCP connections to the stream port, never a byte",
    "idle_websockets": "open WebSockets that never send or read",
    "oversized_http": "one 32 MiB POST (limit 64 KiB)",
    "oversized_ws": "a WebSocket frame declaring 2^40 bytes",
    "malformed_ws": "malformed requests on one WebSocket (40 KB nesting among them)",
    "tls_handshakes": "full TLS handshakes to the Eventer, 32 at once",
    "tls_plaintext": "a plaintext hat frame to the Eventer's TLS port",
    "tls_silent": "TCP connections to the TLS port, never a ClientHello",
}
