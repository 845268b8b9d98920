"""A connection's received messages waiting to be taken, bounded in number and in bytes.

Reading a connection pauses while its queue is full, so a peer that sends faster than it is
served is pushed back by TCP instead of growing our memory: a connection holds at most the
byte bound of messages plus the one frame being read, whatever its peer sends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class ReceiveQueue(Generic[T]):
    """Received items with their sizes; :meth:`end` marks the end for every receiver, after
    the items queued before it.

    A deque and the futures of whoever waits, not an :class:`asyncio.Queue`: every message
    of a connection passes here, and the queue's own bookkeeping (unfinished tasks, its
    ``join`` event, a getter and a putter queue touched at each put and take) was a tenth
    of the loop's work per fire-and-forget register.
    """

    __slots__ = ("_bytes", "_ended", "_getters", "_items", "_max_bytes", "_max_items", "_putters")

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self._items: deque[tuple[T, int]] = deque()
        self._max_items = max_items
        self._max_bytes = max_bytes
        #: Bytes of the queued items; putting waits above the max.
        self._bytes = 0
        self._ended = False
        #: Receivers waiting for an item (or the end), and putters waiting for room.
        self._getters: list[asyncio.Future[None]] = []
        self._putters: list[asyncio.Future[None]] = []

    @property
    def paused(self) -> bool:
        """Full in number or in bytes: whoever puts (the connection's reader) is waiting."""
        return len(self._items) >= self._max_items or self._bytes > self._max_bytes

    def empty(self) -> bool:
        return not self._items

    @property
    def awaited(self) -> bool:
        """Empty, and a receiver waits in :meth:`get` and has not been woken yet: it has
        taken every item queued before (see ``Connection.take_directly`` in chatter)."""
        return not self._items and bool(self._getters)

    def put_ready(self, item: T, size: int) -> bool:
        """Queue ``item`` of ``size`` bytes if that leaves the queue within its bounds (as
        :meth:`put` would, without waiting); False, queueing nothing, if not."""
        if len(self._items) >= self._max_items or self._bytes + size > self._max_bytes:
            return False
        self._append(item, size)
        return True

    async def put(self, item: T, size: int) -> None:
        """Queue ``item`` of ``size`` bytes; return once the queue has room for more."""
        while len(self._items) >= self._max_items:
            await _wait(self._putters)
        self._append(item, size)
        while self._bytes > self._max_bytes:
            await _wait(self._putters)

    def _append(self, item: T, size: int) -> None:
        """Queue ``item``, its bytes counted, waking a waiting receiver."""
        self._items.append((item, size))
        self._bytes += size
        if self._getters:
            _wake(self._getters)

    async def get(self) -> T | None:
        """The next item, or None once every item queued before the end was taken (for
        every later call too)."""
        while not self._items:
            if self._ended:
                return None
            await _wait(self._getters)
        return self._taken(self._items.popleft())

    def get_nowait(self) -> T | None:
        """The next item if one is queued now, else None (also at the end)."""
        if not self._items:
            return None
        return self._taken(self._items.popleft())

    def _taken(self, entry: tuple[T, int]) -> T:
        """The item of a taken entry, its bytes freed (waking a waiting putter: it waits
        for room in number or in bytes, and checks which itself)."""
        item, size = entry
        self._bytes -= size
        if self._putters:
            _wake(self._putters)
        return item

    def end(self) -> None:
        """Mark the end: receivers get every item queued so far, then None.

        Nothing queued is dropped to mark it, however full the queue (an earlier version
        made room for a marker by dropping the oldest item, and a Syncer client whose peer
        went away with a full queue stored the messages after the dropped one: a hole in its
        copy that resuming from its last event id never filled).
        """
        self._ended = True
        _wake(self._getters)


async def _wait(waiters: list[asyncio.Future[None]]) -> None:
    """Wait to be woken (by :func:`_wake`); the caller checks its condition again, so a
    wake-up that finds nothing (another waiter came first) is harmless."""
    waiter = asyncio.get_running_loop().create_future()
    waiters.append(waiter)
    try:
        await waiter
    except asyncio.CancelledError:
        # A receiver that gives up (a timeout) leaves no future behind: one that waits
        # with a timeout again and again would otherwise grow the list for ever.
        with contextlib.suppress(ValueError):  # already woken (and the list cleared)
            waiters.remove(waiter)
        raise


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    """Wake every waiter (each checks its condition again)."""
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
    waiters.clear()
