"""Reading a stream after a position: from the feed when it covers it, else from the store.

Both paths give the same events in position order (see :mod:`.feed`); a store read runs in
a worker thread and encodes its events there, off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor

from tidings.events.model import StoredEvent
from tidings.server.store import EventStore
from tidings.server.store.positions import read_newest, read_positions
from tidings.streams.protocol.encoding import WireEvent, wire_event
from tidings.streams.service.feed import Batch, StreamFeed
from tidings.streams.typemap import TypeMap


class StreamReader:
    """Reads one stream's events for its consumers."""

    def __init__(
        self, store: EventStore, feed: StreamFeed, type_map: TypeMap, executor: Executor
    ) -> None:
        self._store = store
        self.feed = feed
        self._type_map = type_map
        self._executor = executor

    async def read(
        self, after: int, want: Sequence[str] | None, limit: int, max_bytes: int
    ) -> Batch:
        """Up to ``limit`` events of the types in ``want`` (None: all) after ``after``,
        within ``max_bytes`` of encoded events (at least one event, however large)."""
        wanted = None if want is None else frozenset(want)
        batch = self.feed.read(after, wanted, limit, max_bytes)
        if batch is not None:
            return batch
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, self.read_store, after, want, limit, max_bytes
        )

    def read_store(
        self, after: int, want: Sequence[str] | None, limit: int, max_bytes: int
    ) -> Batch:
        """:meth:`read` from the store only (blocking)."""
        patterns = self._type_map.wanted_patterns(want)
        if not patterns:
            return Batch([], max(after, self._store.last_position()))
        found = read_positions(self._store, after, limit, patterns)
        chosen, cut = self._encoded(found.events, max_bytes)
        if cut:
            return Batch(chosen, chosen[-1].position)
        return Batch(chosen, found.scanned)

    async def newest(self, want: Sequence[str] | None, limit: int, max_bytes: int) -> Batch:
        """The newest ``limit`` events of the types in ``want``, in id order, within
        ``max_bytes`` (the newest kept): where a live consumer without a position starts."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._newest, want, limit, max_bytes)

    def _newest(self, want: Sequence[str] | None, limit: int, max_bytes: int) -> Batch:
        patterns = self._type_map.wanted_patterns(want)
        found = read_newest(self._store, limit, patterns) if patterns else []
        chosen = self._encoded(found[::-1], max_bytes)[0][::-1]
        return Batch(chosen, chosen[-1].position if chosen else 0)

    def _encoded(
        self, events: Sequence[StoredEvent], max_bytes: int
    ) -> tuple[list[WireEvent], bool]:
        """``events`` encoded, as many as fit ``max_bytes`` (at least one), and whether
        some were left out for size. Consumer events that a wide pattern selected are left
        out: no stream carries them (:meth:`.TypeMap.name_of`)."""
        chosen: list[WireEvent] = []
        size = 0
        for event in events:
            name = self._type_map.name_of(event.type)
            if name is None:
                continue
            encoded = wire_event(event, name)
            size += len(encoded.encoded) + 1
            if chosen and size > max_bytes:
                return chosen, True
            chosen.append(encoded)
        return chosen, False
