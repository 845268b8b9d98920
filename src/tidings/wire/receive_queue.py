"""A connection's received messages waiting to be taken, bounded in number and in bytes.

Reading a connection pauses while its queue is full, so a peer that sends faster than it is
served is pushed back by TCP instead of growing our memory: a connection holds at most the
byte bound of messages plus the one frame being read, whatever its peer sends.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Generic, TypeVar

T = TypeVar("T")


class ReceiveQueue(Generic[T]):
    """Received items with their sizes; :meth:`end` marks the end for every receiver."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self._queue: asyncio.Queue[tuple[T, int] | None] = asyncio.Queue(max_items)
        self._max_bytes = max_bytes
        #: Bytes of the queued items; putting waits (``_room`` clear) above the max.
        self._bytes = 0
        self._room = asyncio.Event()
        self._room.set()

    @property
    def paused(self) -> bool:
        """Full in number or in bytes: whoever puts (the connection's reader) is waiting."""
        return self._queue.full() or not self._room.is_set()

    def empty(self) -> bool:
        return self._queue.empty()

    async def put(self, item: T, size: int) -> None:
        """Queue ``item`` of ``size`` bytes; return once the queue has room for more."""
        self._bytes += size
        if self._bytes > self._max_bytes:
            self._room.clear()
        await self._queue.put((item, size))
        await self._room.wait()

    async def get(self) -> T | None:
        """The next item, or None once the end is reached (for every later call too)."""
        entry = await self._queue.get()
        if entry is None:
            self._queue.put_nowait(None)  # wake other receivers too
            return None
        item, size = entry
        self._bytes -= size
        if self._bytes <= self._max_bytes:
            self._room.set()
        return item

    def end(self) -> None:
        """Mark the end: receivers stop at it, so items still queued are dropped if need be."""
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)
        if self._queue.full():
            # Make room for the end marker: receivers stop at it, queued items are moot.
            with contextlib.suppress(asyncio.QueueEmpty):
                self._queue.get_nowait()
            self._queue.put_nowait(None)
