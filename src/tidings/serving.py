"""uvicorn on a socket tidings binds itself, for the HTTP/WebSocket servers it embeds (the
FTN18 streams, the intermediaries' subscriber transport).

Binding here, before uvicorn starts, makes a port in use an error at start-up rather than a
log line in a background task; the embedding process owns SIGINT and SIGTERM, so uvicorn's
own signal handlers are off.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from uvicorn._types import ASGISendEvent
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the embedding process stops it with everything
    else."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class DenyingWebSockets(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol, with the handshake counted as complete once a
    denial response (a refusal before the upgrade, e.g. 401) has been sent.

    uvicorn 0.54 leaves it incomplete, so every refused handshake also logged "ASGI callable
    returned without completing handshake" at ERROR: a log line an attacker could make at
    will, and an alert for nothing. Its wsproto implementation already does this; the fix is
    proposed upstream (Kludex/uvicorn#3138), and this class goes when a release has it."""

    async def send(self, message: ASGISendEvent) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True


def listen(host: str, port: int, send_buffer: int | None = None) -> socket.socket:
    """A listening TCP socket whose connections send small replies at once (and, with
    ``send_buffer``, hold at most that much unsent data per peer: accepted connections
    inherit SO_SNDBUF on Linux).

    Made with ``IPPROTO_TCP`` named: asyncio sets TCP_NODELAY on accepted connections only
    for sockets whose protocol says TCP, and ``socket.create_server`` leaves it 0. Without
    it, Nagle's algorithm held each reply on a kept-alive HTTP connection until the client's
    delayed ACK: ~40 ms a request.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if send_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock
