"""Raw-socket peers that misbehave below what a client library would send: connections that
never send a byte, request heads sent one header at a time (slowloris), and the check of
whether the server closed them. Shared by the hostile benchmarks (``bench.hostile``) and
the tests of the servers' slow-client defences, so both speak of the same attacker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

#: The start of an HTTP request whose head a slowloris never finishes.
SLOW_HEAD = b"POST / HTTP/1.1\r\nHost: x\r\n"
#: One more header line of it.
SLOW_LINE = b"X-a: b\r\n"

Opened = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def closed_within(reader: asyncio.StreamReader, timeout: float) -> bool:
    """Whether the server closes the connection within ``timeout`` s (reading, and
    dropping, whatever it sends meanwhile)."""
    try:
        async with asyncio.timeout(timeout):
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                while await reader.read(65536):
                    pass
        return True
    except TimeoutError:
        return False


async def open_many(
    port: int, count: int, tls: ssl.SSLContext | None = None, first: bytes = b""
) -> list[Opened]:
    """``count`` connections to ``port`` on the loopback (over TLS with ``tls``), each
    sending ``first``; those refused at once are left out."""
    opened = []
    for _ in range(count):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
        except (OSError, ssl.SSLError):
            continue
        if first:
            writer.write(first)
        opened.append((reader, writer))
    return opened


async def trickle(writers: list[asyncio.StreamWriter], every_s: float, seconds: float) -> None:
    """Send one more header line on each open connection every ``every_s`` s, for
    ``seconds`` (or until cancelled): the slowloris' drip."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        await asyncio.sleep(every_s)
        for writer in writers:
            if not writer.is_closing():
                with contextlib.suppress(ConnectionError):
                    writer.write(SLOW_LINE)


async def closed_count(opened: list[Opened]) -> int:
    """How many of the connections the server has closed by now; all of them closed here."""
    closed = 0
    for reader, writer in opened:
        closed += await closed_within(reader, 0.01)
        writer.close()
    return closed
