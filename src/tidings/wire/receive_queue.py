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
    """Received items with their sizes; :meth:`end` marks the end for every receiver, after
    the items queued before it."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self._queue: asyncio.Queue[tuple[T, int] | None] = asyncio.Queue(max_items)
        self._max_bytes = max_bytes
        #: Bytes of the queued items; putting waits (``_room`` clear) above the max.
        self._bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._ended = False

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
        # Without a coroutine each when there is room (every message passes here).
        if self._queue.full():
            await self._queue.put((item, size))
        else:
            self._queue.put_nowait((item, size))
        if not self._room.is_set():
            await self._room.wait()

    async def get(self) -> T | None:
        """The next item, or None once every item queued before the end was taken (for
        every later call too)."""
        if self._queue.empty():
            if self._ended:
                return None
            return self._taken(await self._queue.get())
        return self._taken(self._queue.get_nowait())

    def get_nowait(self) -> T | None:
        """The next item if one is queued now, else None (also at the end)."""
        if self._queue.empty():
            return None
        return self._taken(self._queue.get_nowait())

    def _taken(self, entry: tuple[T, int] | None) -> T | None:
        """The item of a taken entry, its bytes freed; the end marker is put back, for
        every later call and every other receiver."""
        if entry is None:
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(None)
            return None
        item, size = entry
        self._bytes -= size
        if self._bytes <= self._max_bytes:
            self._room.set()
        return item

    def end(self) -> None:
        """Mark the end: receivers get every item queued so far, then None.

        A full queue takes no end marker, and none is needed: its receivers are not waiting,
        and once they have emptied it :meth:`get` sees the end. (An earlier version made room
        for a marker by dropping the oldest item, and a Syncer client whose peer went away
        with a full queue stored the messages after the dropped one: a hole in its copy that
        resuming from its last event id never filled.)
        """
        self._ended = True
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)
