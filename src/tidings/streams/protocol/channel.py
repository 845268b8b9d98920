"""A consumer's WebSocket as FTN3 sees it: a bi-directional channel.

Both sides make calls on it: the consumer's requests (rids ``C1``, ``C2``, …) and the
server's pushes (``S1``, ``S2``, …, FutoIn's numbering), each answered by a reply with the
same rid. Frames are sent one at a time in the order they were queued; a call's reply
resolves its future, and closing the channel fails every call still unanswered, so a push
session waiting for an acknowledgement learns at once that it will not come.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from tidings.errors import ConnectionClosed
from tidings.streams.protocol.ftn3 import Reply

log = logging.getLogger(__name__)


class Channel:
    """One WebSocket connection; ``send`` writes one frame."""

    def __init__(
        self,
        send: Callable[[bytes], Awaitable[None]],
        close: Callable[[], Awaitable[None]],
        peer: str,
    ) -> None:
        self._send = send
        self._close = close
        self._closing: asyncio.Task[None] | None = None
        self.peer = peer
        self._lock = asyncio.Lock()
        self._next_rid = 1
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        self.closed = asyncio.Event()
        #: Called once when the channel closes (the push session's wake-up).
        self.on_close: Callable[[], None] | None = None

    async def send(self, frame: bytes) -> None:
        """Send one frame; ConnectionClosed if the channel is closed."""
        if self.closed.is_set():
            raise ConnectionClosed(f"stream channel to {self.peer} is closed")
        async with self._lock:
            try:
                await self._send(frame)
            except Exception as exc:
                self.close()
                raise ConnectionClosed(f"stream channel to {self.peer}: {exc}") from exc

    async def call(self, function: str, params: bytes) -> asyncio.Future[Reply]:
        """Send a call of ``function`` with the encoded JSON object ``params``; return the
        future of its reply (failing with ConnectionClosed if the channel closes first)."""
        rid = f"S{self._next_rid}"
        self._next_rid += 1
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        frame = b'{"f":"' + function.encode() + b'","p":' + params + b',"rid":"' + rid.encode()
        try:
            await self.send(frame + b'"}')
        except ConnectionClosed:
            self._pending.pop(rid, None)
            raise
        return future

    async def _close_socket(self) -> None:
        with contextlib.suppress(Exception):
            await self._close()

    def answer(self, reply: Reply) -> None:
        """A reply from the peer to one of our calls."""
        future = self._pending.pop(reply.rid, None)
        if future is None:
            log.debug(
                "stream channel: reply to no pending call",
                extra={"peer": self.peer, "rid": reply.rid},
            )
        elif not future.done():
            future.set_result(reply)

    def close(self) -> None:
        """Close the channel (the socket too) and fail every unanswered call."""
        if not self.closed.is_set():
            self._closing = asyncio.get_running_loop().create_task(self._close_socket())
        self.closed.set()
        if self.on_close is not None:
            self.on_close()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionClosed(f"stream channel to {self.peer} closed"))
