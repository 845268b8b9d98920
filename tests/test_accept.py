"""The guarded accept on real sockets (:mod:`tidings.accept`): one address over its bound is
closed at accept while another address is served, a seat comes back when its connection
closes, a TLS listener hands nothing to its server before the client's first byte and closes
a silent client at the timeout and one whose first byte is plaintext at once, and closing
the server closes what waits.

The attacker connects from 127.0.0.2 and the bystander from 127.0.0.1 (both loopback: Linux
routes all of 127/8 there), so one process plays both addresses."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.support.waiting import run, until
from tidings.accept import (
    NOT_TLS,
    SILENT_TLS,
    TOO_MANY_FROM_ADDRESS,
    AcceptRules,
    GuardedListener,
    listen,
)

pytestmark = pytest.mark.sockets

ATTACKER, BYSTANDER = "127.0.0.2", "127.0.0.1"
#: What the clients send: each line starts as a TLS record does (type 22, a handshake), which
#: a TLS listener's guard lets through; the echo server behind it reads lines.
HELLO = b"\x16hello\n"


class Echo:
    """An asyncio server behind a guard, echoing each line; what it saw and refused."""

    def __init__(self) -> None:
        self.accepted = 0
        self.refused: list[tuple[str, str]] = []
        self.guard: GuardedListener | None = None

    def refuse(self, reason: str, address: str) -> None:
        self.refused.append((reason, address))

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


@asynccontextmanager
async def echo(rules: AcceptRules) -> AsyncIterator[tuple[Echo, int]]:
    served = Echo()
    guard = GuardedListener(listen("127.0.0.1", 0), rules, served.refuse)
    served.guard = guard
    server = await asyncio.start_server(served.serve, sock=guard.handoff)
    try:
        yield served, guard.port
    finally:
        server.close()
        await server.wait_closed()


async def connect(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def echoed(port: int, source: str) -> bytes:
    reader, writer = await connect(port, source)
    try:
        writer.write(HELLO)
        return await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """The server closed the connection (an end of file, or a reset)."""
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:
        return True


def test_an_address_over_its_bound_is_closed_at_accept_and_another_is_served() -> None:
    async def main() -> None:
        async with echo(AcceptRules(max_per_address=2)) as (served, port):
            held = [await connect(port, ATTACKER) for _ in range(2)]
            assert [await echoed_on(r, w) for r, w in held] == [b"a\n", b"a\n"]
            reader, writer = await connect(port, ATTACKER)
            assert await closed_by_server(reader)
            writer.close()
            assert served.refused == [(TOO_MANY_FROM_ADDRESS, ATTACKER)]
            assert served.accepted == 2  # the server never saw the third
            # The bystander, from another address, is served meanwhile.
            assert await echoed(port, BYSTANDER) == HELLO
            # A seat comes back when its connection closes.
            held[0][1].close()
            assert served.guard is not None
            await until(lambda: served.guard is not None and served.guard.held(ATTACKER) == 1)
            assert await echoed(port, ATTACKER) == HELLO
            held[1][1].close()

    run(main())


async def echoed_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"a\n")
    return await asyncio.wait_for(reader.readline(), 5)


def test_a_tls_listener_hands_over_a_connection_only_after_its_first_byte() -> None:
    async def main() -> None:
        async with echo(AcceptRules(max_per_address=None, first_byte_timeout=30)) as (
            served,
            port,
        ):
            reader, writer = await connect(port, BYSTANDER)
            assert served.guard is not None
            await until(lambda: served.guard is not None and served.guard.held(BYSTANDER) == 1)
            await asyncio.sleep(0.1)  # time for a hand-over that should not happen
            assert served.accepted == 0
            writer.write(b"\x16first\n")
            assert await asyncio.wait_for(reader.readline(), 5) == b"\x16first\n"
            assert served.accepted == 1
            writer.close()

    run(main())


def test_a_silent_client_of_a_tls_listener_is_closed_at_the_timeout_and_counted() -> None:
    async def main() -> None:
        async with echo(AcceptRules(max_per_address=10, first_byte_timeout=0.2)) as (
            served,
            port,
        ):
            reader, writer = await connect(port, ATTACKER)
            assert await closed_by_server(reader)
            writer.close()
            assert served.refused == [(SILENT_TLS, ATTACKER)]
            assert served.accepted == 0
            assert served.guard is not None and served.guard.held(ATTACKER) == 0
            assert await echoed(port, BYSTANDER) == HELLO

    run(main())


def test_plaintext_to_a_tls_listener_is_closed_at_its_first_byte_and_counted() -> None:
    """A hat frame or an HTTP request sent to a TLS port: refused from the first byte, with no
    TLS state made for it and the server never seeing it; a client whose first byte begins a
    TLS record is handed over."""

    async def main() -> None:
        async with echo(AcceptRules(max_per_address=10, first_byte_timeout=30)) as (
            served,
            port,
        ):
            for plaintext in (b"GET / HTTP/1.1\r\n\r\n", b"\x00\x00\x00\x10hat"):
                reader, writer = await connect(port, ATTACKER)
                writer.write(plaintext)
                assert await closed_by_server(reader)
                writer.close()
            assert served.refused == [(NOT_TLS, ATTACKER), (NOT_TLS, ATTACKER)]
            assert served.accepted == 0
            assert served.guard is not None and served.guard.held(ATTACKER) == 0
            assert await echoed(port, ATTACKER) == HELLO
            assert served.accepted == 1

    run(main())


def test_closing_the_server_closes_the_port_and_the_connections_waiting() -> None:
    async def main() -> None:
        served = Echo()
        guard = GuardedListener(
            listen("127.0.0.1", 0), AcceptRules(first_byte_timeout=30), served.refuse
        )
        server = await asyncio.start_server(served.serve, sock=guard.handoff)
        reader, writer = await connect(guard.port, BYSTANDER)
        await until(lambda: guard.held(BYSTANDER) == 1)
        server.close()
        await server.wait_closed()
        assert await closed_by_server(reader)
        writer.close()
        assert guard.held(BYSTANDER) == 0
        with pytest.raises(ConnectionRefusedError):
            await connect(guard.port, BYSTANDER)

    run(main())


def test_on_uvloop_the_server_is_given_the_socket_itself_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """uvloop accepts in libuv, past any Python ``accept``: nothing can be enforced there,
    so the server gets the listening socket and serves, and a warning says so."""
    import uvloop

    async def main() -> None:
        async with echo(AcceptRules(max_per_address=1)) as (served, port):
            assert served.guard is not None and served.guard.handoff is served.guard._sock
            assert await echoed(port, BYSTANDER) == HELLO

    with caplog.at_level(logging.WARNING):
        uvloop.run(asyncio.wait_for(main(), 30))
    assert any("no accept limits" in r.getMessage() for r in caplog.records)
