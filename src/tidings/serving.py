"""uvicorn on a socket tidings binds itself, for the HTTP/WebSocket servers it embeds (the
FTN18 streams, the intermediaries' subscriber transport).

Binding first (:func:`tidings.accept.listen`), before uvicorn starts, makes a port in use an
error at start-up rather than a log line in a background task; the embedding process owns
SIGINT and SIGTERM, so uvicorn's own signal handlers are off. uvicorn serves the connections
a :class:`~tidings.accept.GuardedListener` lets through (:func:`serve_guarded`), with
asyncio's TLS handshake bounded by tidings' timeout rather than asyncio's 60 s, which
uvicorn has no setting for.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Iterator

import uvicorn
from uvicorn._types import ASGISendEvent
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from tidings.accept import AcceptRules, GuardedListener, Refused
from tidings.accept import listen as listen


class QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers (the embedding process stops it with everything
    else), whose TLS handshakes end after ``tls_handshake_timeout`` seconds."""

    def __init__(self, config: uvicorn.Config, tls_handshake_timeout: float | None = None):
        super().__init__(config)
        self.tls_handshake_timeout = tls_handshake_timeout

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn 0.54's start on the sockets given (the only way tidings starts it), with
        the one thing its own lacks: ``ssl_handshake_timeout`` passed to asyncio."""
        if sockets is None:
            await super().startup(sockets)
            return
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)
        config = self.config

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
                _loop=_loop,
            )

        loop = asyncio.get_running_loop()
        timeout = None if config.ssl is None else self.tls_handshake_timeout
        self.servers = [
            await loop.create_server(
                create_protocol,
                sock=sock,
                ssl=config.ssl,
                backlog=config.backlog,
                ssl_handshake_timeout=timeout,
            )
            for sock in sockets
        ]
        self.started = True


def serve_guarded(
    config: uvicorn.Config,
    sock: socket.socket,
    rules: AcceptRules,
    tls_handshake_timeout: float,
    on_refused: Refused | None = None,
) -> tuple[QuietServer, asyncio.Task[None]]:
    """uvicorn serving ``config``'s app on the connections ``rules`` let through ``sock``
    (refusals told to ``on_refused``), its TLS handshakes bounded by
    ``tls_handshake_timeout``; the task runs it (set ``should_exit`` to stop it). When it
    ends, however (stopped, or failed to start), ``sock`` is closed. Call it on the loop
    that serves."""
    guard = GuardedListener(sock, rules, on_refused)
    server = QuietServer(config, tls_handshake_timeout)
    try:
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[guard.handoff]))
    except BaseException:
        guard.close()
        raise
    task.add_done_callback(lambda _: guard.close())
    return server, task


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
