"""The attacks, each an async function of the target and the scale that returns what
happened to the attacker in a few words. Raw sockets where the attack is below what a
client library would send (slowloris, lying frame headers, plaintext to a TLS port)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import websockets

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


async def _bounded(count: int, one: Callable[[int], Awaitable[str]]) -> dict[str, int]:
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


def _summary(outcomes: dict[str, int]) -> str:
    return ", ".join(f"{n:,} {what}" for what, n in sorted(outcomes.items(), key=lambda x: -x[1]))


async def _closed_within(reader: asyncio.StreamReader, timeout: float) -> bool:
    """Whether the server closes the connection within ``timeout`` (reading what it sends)."""
    try:
        async with asyncio.timeout(timeout):
            with contextlib.suppress(ConnectionError):
                while await reader.read(65536):
                    pass
        return True
    except TimeoutError:
        return False


async def _report(
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]], held: float
) -> str:
    """How many of the connections the server has closed by now; close them all."""
    closed = 0
    for reader, writer in opened:
        closed += await _closed_within(reader, 0.01)
        writer.close()
    return f"{len(opened):,} opened, {closed:,} closed by the server within {held:g} s"


async def _open(
    port: int, count: int, tls: ssl.SSLContext | None = None, first: bytes = b""
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``count`` connections, each sending ``first`` (those refused at once left out)."""
    opened = []
    for _ in range(count):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
        except OSError:
            continue
        if first:
            writer.write(first)
        opened.append((reader, writer))
    return opened


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

        return _summary(await _bounded(target.count, one))


async def slowloris(target: Target) -> str:
    """``count`` connections, each sending an HTTP request's head one header a second."""
    opened = await _open(target.stream_port, target.count, first=b"POST / HTTP/1.1\r\nHost: x\r\n")
    deadline = time.monotonic() + target.hold_s
    while time.monotonic() < deadline:
        await asyncio.sleep(1)
        for _, writer in opened:
            if not writer.is_closing():
                with contextlib.suppress(ConnectionError):
                    writer.write(b"X-a: b\r\n")
    return await _report(opened, target.hold_s)


async def idle_connections(target: Target) -> str:
    """``count`` TCP connections to the stream's port that never send a byte."""
    opened = await _open(target.stream_port, target.count)
    await asyncio.sleep(target.hold_s)
    return await _report(opened, target.hold_s)


async def idle_websockets(target: Target) -> str:
    """``count`` opened WebSockets that never send a request (nor read)."""
    sockets = []
    for _ in range(target.count):
        with contextlib.suppress(Exception):
            sockets.append(await websockets.connect(target.stream_url.replace("http", "ws")))
    await asyncio.sleep(target.hold_s)
    open_now = sum(ws.state.name == "OPEN" for ws in sockets)
    for ws in sockets:
        with contextlib.suppress(Exception):
            await ws.close()
    closed = len(sockets) - open_now
    return f"{len(sockets):,} opened, {closed:,} closed by the server within {target.hold_s:g} s"


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


async def oversized_ws_header(target: Target) -> str:
    """A WebSocket frame whose header declares 2^40 bytes, then a trickle of them."""
    async with websockets.connect(target.stream_url.replace("http", "ws")) as ws:
        transport = ws.transport
        # FIN, text; masked, 127: a 64-bit length follows; then the mask.
        transport.write(b"\x81\xff" + (1 << 40).to_bytes(8, "big") + b"\0\0\0\0" + b"a" * 65536)
        try:
            async with asyncio.timeout(30):
                await ws.wait_closed()
        except TimeoutError:
            return "still open after 30 s"
        return f"closed by the server: {ws.close_code} {ws.close_reason!r}"


def _malformed(i: int) -> str:
    kinds = [
        "not json",
        "[" * 20000 + "]" * 20000,  # the deep nesting
        json.dumps({"f": "futoin.evt.poll:1.1:pollEvents", "p": [], "rid": "C1"}),
        json.dumps({"f": "nonsense", "rid": "C1"}),
        "\x00\xff" * 100,
    ]
    return kinds[i % len(kinds)]


async def malformed_frames(target: Target) -> str:
    """``count`` malformed requests on a WebSocket, each answered before the next; a new
    WebSocket whenever the server closed one (counted)."""
    outcomes: dict[str, int] = {}
    ws = await websockets.connect(target.stream_url.replace("http", "ws"))
    try:
        for i in range(target.count):
            try:
                await ws.send(_malformed(i))
                async with asyncio.timeout(30):
                    reply = json.loads(await ws.recv())
                outcome = str(reply.get("e", "answered"))
            except TimeoutError:
                outcome = "no answer in 30 s"
            except websockets.ConnectionClosed as exc:
                outcome = f"WebSocket closed ({exc.rcvd.code if exc.rcvd else '-'})"
                ws = await websockets.connect(target.stream_url.replace("http", "ws"))
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        await ws.close()
    return _summary(outcomes)


async def tls_handshake_flood(target: Target) -> str:
    """``count`` full TLS handshakes to the Eventer, each closed at once."""

    async def one(_: int) -> str:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", target.eventer_port, ssl=target.client_tls
        )
        writer.close()
        return "handshakes"

    return _summary(await _bounded(target.count, one))


async def tls_plaintext(target: Target) -> str:
    """``count`` connections sending a plaintext hat frame to the Eventer's TLS port."""

    async def one(_: int) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", target.eventer_port)
        writer.write(frame("MsgSubscribe", b"\x80"))
        closed = await _closed_within(reader, 30)
        writer.close()
        return "closed by the server" if closed else "still open after 30 s"

    return _summary(await _bounded(target.count, one))


async def tls_silent(target: Target) -> str:
    """``count`` TCP connections to the Eventer's TLS port that never start a handshake."""
    opened = await _open(target.eventer_port, target.count)
    await asyncio.sleep(target.hold_s)
    return await _report(opened, target.hold_s)


#: name -> (what the attacker does, the attack).
ATTACKS: dict[str, tuple[str, Callable[[Target], Awaitable[str]]]] = {
    "bad_passwords": ("POSTs with wrong passwords, 32 at once", bad_passwords),
    "slowloris": ("HTTP heads sent one header a second", slowloris),
    "idle_tcp": ("TCP connections to the stream port, never a byte", idle_connections),
    "idle_websockets": ("open WebSockets that never send or read", idle_websockets),
    "oversized_http": ("one 32 MiB POST (limit 64 KiB)", oversized_http),
    "oversized_ws": ("a WebSocket frame declaring 2^40 bytes", oversized_ws_header),
    "malformed_ws": (
        "malformed requests on one WebSocket (40 KB nesting among them)",
        malformed_frames,
    ),
    "tls_handshakes": ("full TLS handshakes to the Eventer, 32 at once", tls_handshake_flood),
    "tls_plaintext": ("a plaintext hat frame to the Eventer's TLS port", tls_plaintext),
    "tls_silent": ("TCP connections to the TLS port, never a ClientHello", tls_silent),
}
