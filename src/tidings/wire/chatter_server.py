"""Listening for chatter connections: every accepted one is served by a handler.

The server side of :mod:`tidings.wire.chatter` (whose :func:`~tidings.wire.chatter.connect`
is the client side): the Eventer and Syncer servers listen with :func:`listen`, each
connection gets a task of its own running the handler, and closing the server closes every
connection and waits for the handlers, so a closed server leaves nothing running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tidings.address import parse_address
from tidings.errors import ConnectionClosed
from tidings.wire.chatter import DEFAULT_MAX_FRAME_BYTES, DEFAULT_PING_INTERVAL, Connection

log = logging.getLogger(__name__)

#: Serves one accepted connection; the connection is closed when it returns.
Handler = Callable[[Connection], Awaitable[None]]


class Server:
    """A listening chatter server; every accepted connection is served by ``handler``."""

    def __init__(
        self,
        server: asyncio.Server,
        connections: set[Connection],
        handlers: set[asyncio.Task[None]],
    ) -> None:
        self._server = server
        self._connections = connections
        self._handlers = handlers

    @property
    def port(self) -> int:
        """The bound port (useful after listening on port 0)."""
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def connections(self) -> frozenset[Connection]:
        return frozenset(self._connections)

    async def aclose(self) -> None:
        """Stop accepting, close every connection and wait for their handlers."""
        self._server.close()
        for connection in list(self._connections):
            connection.close()
        # Python 3.11's Server.wait_closed returns at once once closed, so the handlers are
        # awaited here (tasks accepted just before the close included; not a handler that
        # closes the server itself, which would wait for itself).
        current = asyncio.current_task()
        while pending := [task for task in self._handlers if task is not current]:
            await asyncio.gather(*pending, return_exceptions=True)
        await self._server.wait_closed()


async def listen(
    address: str,
    handler: Handler,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ping_interval: float | None = DEFAULT_PING_INTERVAL,
) -> Server:
    """Listen on ``address`` and serve each connection with ``handler``."""
    host, port = parse_address(address)
    connections: set[Connection] = set()
    handlers: set[asyncio.Task[None]] = set()

    async def on_accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each accepted connection's callback in a task
        handlers.add(task)
        task.add_done_callback(handlers.discard)
        connection = Connection(
            reader, writer, max_frame_bytes=max_frame_bytes, ping_interval=ping_interval
        )
        connections.add(connection)
        try:
            if server.is_serving():  # else accepted just as the server closed: drop it
                await handler(connection)
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("chatter handler failed for %s", connection.peer)
        finally:
            connections.discard(connection)
            await connection.aclose()

    server = await asyncio.start_server(on_accept, host, port, limit=2**16)
    return Server(server, connections, handlers)
