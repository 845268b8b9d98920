"""Listening for chatter connections: every accepted one is served by a handler.

The server side of :mod:`tidings.wire.chatter` (whose :func:`~tidings.wire.chatter_client.connect`
is the client side): the Eventer and Syncer servers listen with :func:`listen`, each
connection gets a task of its own running the handler, and closing the server closes every
connection and waits for the handlers, so a closed server leaves nothing running. On an
``ssl+sbs://`` address every connection is a TLS session first (hat-event 0.8.5's framing
inside it), and a failed handshake is logged and counted, never handed to the handler.

Connections are accepted by a :class:`~tidings.accept.GuardedListener`: at most
``max_per_address`` at once from one client address, and on a TLS address none costs TLS
state before it has sent a byte (a silent one is closed after ``handshake_timeout``, as is
one whose handshake then takes longer).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable

from tidings.accept import (
    DEFAULT_MAX_PER_ADDRESS,
    DEFAULT_TLS_HANDSHAKE_TIMEOUT,
    AcceptRules,
    GuardedListener,
)
from tidings.accept import (
    listen as listen_tcp,
)
from tidings.address import parse_endpoint
from tidings.errors import ConfigError, ConnectionClosed
from tidings.wire.chatter import DEFAULT_MAX_FRAME_BYTES, DEFAULT_PING_INTERVAL, Connection

log = logging.getLogger(__name__)

#: Serves one accepted connection; the connection is closed when it returns.
Handler = Callable[[Connection], Awaitable[None]]
#: How long an accepted connection may stay silent, then take to finish its TLS handshake.
DEFAULT_HANDSHAKE_TIMEOUT = DEFAULT_TLS_HANDSHAKE_TIMEOUT
#: The ``on_refused`` reason of a TLS handshake that failed or timed out (besides
#: :mod:`tidings.accept`'s reasons: a silent connection, one address over its bound).
TLS_HANDSHAKE = "tls_handshake"


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
    tls: ssl.SSLContext | None = None,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ping_interval: float | None = DEFAULT_PING_INTERVAL,
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    max_per_address: int | None = DEFAULT_MAX_PER_ADDRESS,
    on_refused: Callable[[str], None] | None = None,
) -> Server:
    """Listen on ``address`` and serve each connection with ``handler``.

    An ``ssl+sbs://`` address needs ``tls``, the server's context (a ConfigError otherwise,
    as is ``tls`` with a ``tcp+sbs://`` address). A connection whose handshake fails, or
    that sends nothing for ``handshake_timeout`` seconds, or whose handshake then takes
    longer, is closed with a log line and ``on_refused`` called with why (to count it:
    :data:`TLS_HANDSHAKE`, :data:`tidings.accept.SILENT_TLS`, or
    :data:`tidings.accept.TOO_MANY_FROM_ADDRESS` for a connection over
    ``max_per_address``); the handler never sees it. A port that cannot be bound is an
    OSError.
    """
    host, port, secure = parse_endpoint(address)
    if secure and tls is None:
        raise ConfigError(f"{address}: an ssl+sbs address needs tls (a certificate and its key)")
    if tls is not None and not secure:
        raise ConfigError(
            f"{address}: tls is set, so the address must be ssl+sbs://, not tcp+sbs://"
        )
    connections: set[Connection] = set()
    handlers: set[asyncio.Task[None]] = set()

    async def on_accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each accepted connection's callback in a task
        handlers.add(task)
        task.add_done_callback(handlers.discard)
        if tls is not None and not await _handshake(writer, tls, handshake_timeout):
            if on_refused is not None:
                on_refused(TLS_HANDSHAKE)
            return
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

    rules = AcceptRules(max_per_address, handshake_timeout if tls is not None else None)
    try:
        sock = listen_tcp(host, port)
    except OSError as exc:  # named as asyncio's own start_server names it
        why = (exc.strerror or str(exc)).lower()
        raise OSError(
            exc.errno, f"error while attempting to bind on address {(host, port)!r}: {why}"
        ) from None
    guard = GuardedListener(sock, rules, None if on_refused is None else _reason_only(on_refused))
    try:
        server = await asyncio.start_server(on_accept, sock=guard.handoff, limit=2**16)
    except BaseException:
        guard.close()
        raise
    return Server(server, connections, handlers)


def _reason_only(on_refused: Callable[[str], None]) -> Callable[[str, str], None]:
    return lambda reason, _address: on_refused(reason)


async def _handshake(writer: asyncio.StreamWriter, context: ssl.SSLContext, timeout: float) -> bool:
    """Upgrade an accepted connection to TLS; on failure log why, drop it and return False.

    The handshake is made here rather than by the listening socket, so that a refused one
    (a client certificate not from the CA, none where one is required, plaintext sent to
    the TLS port, a client that never finishes) is logged and counted: asyncio's own
    listener drops those silently.
    """
    peer = writer.get_extra_info("peername")
    where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
    level = logging.WARNING
    try:
        async with asyncio.timeout(timeout):
            await writer.start_tls(context)
        return True
    except (ssl.SSLEOFError, ConnectionResetError) as exc:
        # The peer hung up: a port probe (a load balancer's TCP check), or a client that
        # refused our certificate and says so on its side. Noted, not warned of.
        level = logging.INFO
        reason = f"connection lost during the handshake ({str(exc) or type(exc).__name__})"
    except ssl.SSLCertVerificationError as exc:
        reason = f"client certificate refused: {exc.verify_message}"
    except ssl.SSLError as exc:
        reason = f"{exc.reason or exc}" + (
            " (plaintext sent to a TLS port? the client must use ssl+sbs://)"
            if exc.reason in _PLAINTEXT_REASONS
            else ""
        )
    except TimeoutError:
        reason = f"no handshake within {timeout:g} s"
    except (ConnectionError, OSError) as exc:
        reason = f"connection lost during the handshake ({str(exc) or type(exc).__name__})"
    log.log(
        level,
        "TLS handshake with %s refused: %s",
        where,
        reason,
        extra={"peer": where, "reason": reason},
    )
    # Closed, not aborted: the alert telling the client why (its certificate is missing
    # or not trusted) may still be in the buffer, and it is a few bytes.
    writer.close()
    return False


#: OpenSSL's reasons for a first record that is not TLS (what a tcp+sbs client sends).
_PLAINTEXT_REASONS = frozenset({"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"})
