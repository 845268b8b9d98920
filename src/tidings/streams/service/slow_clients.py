"""Closing connections that never finish a request head: slowloris and idle sockets.

uvicorn times a connection out only between requests (its keep-alive timeout starts when a
response is complete, and any byte cancels it). A peer that connects and sends nothing, or
sends a request head a header at a time, holds its socket, and its file descriptor, for as
long as it likes: a few thousand such peers exhaust the server's descriptors and every
stream on the port stops accepting. This protocol gives each request head
:data:`REQUEST_HEAD_TIMEOUT_S` seconds, from the connection (or the previous response) to
the head's last byte, however slowly the bytes come. A WebSocket, once upgraded, is no
longer timed here. Each closed connection is counted through ``on_refused`` (the stream
metrics' ``slow_request_head`` refusals) and not logged: counting costs nothing per peer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

#: Seconds a peer has to send a whole request head (a browser or FutoIn's client needs
#: milliseconds; the time only has to outlast a slow network).
REQUEST_HEAD_TIMEOUT_S = 10.0


def protocol_class(on_refused: Callable[[], None]) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol with the request head timeout, calling ``on_refused``
    for each connection it closes."""

    class RequestHeadTimeout(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(REQUEST_HEAD_TIMEOUT_S, self._too_slow)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _too_slow(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                on_refused()
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            # A head is complete once h11 has moved past waiting for one.
            if self.conn.their_state is not h11.IDLE and self.cycle is not None:
                self._disarm()

        def handle_websocket_upgrade(self, event: Any) -> None:
            self._disarm()
            super().handle_websocket_upgrade(event)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return RequestHeadTimeout
