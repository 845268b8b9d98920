"""Reading a stream after a position: from the feed when it covers it, else from the store.

Both paths give the same events in position order (see :mod:`.feed`), chosen by the
consumer's :class:`~.selection.Selection`; a store read runs in a worker thread and encodes
and filters its events there, off the event loop. A store read whose events the data filter
all drops reads on. For a reading that moves a position (a registered consumer's, a push
session's), it stops after :data:`MAX_STORE_READS` reads, however many events it found, so
that one request's work is bounded: the position moves past what it looked at, and the next
read goes on from there. A stateless ``LIVE`` poll has no position to move, so it reads on
until it finds an event or the end of the log (``exhaustive``): an empty reply must mean
that there is nothing after ``last_id`` for it, or the poller (and the Spark source, which
reads its micro-batches so) would stop there for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from tidings.events.model import StoredEvent
from tidings.server.store import EventStore
from tidings.server.store.positions import read_newest, read_positions
from tidings.streams.protocol.encoding import WireEvent, wire_event
from tidings.streams.service.feed import Batch, StreamFeed
from tidings.streams.service.selection import Selection
from tidings.streams.typemap import TypeMap

#: Store reads of ``limit`` events one read may make while the filter drops them all.
MAX_STORE_READS = 10


@dataclass(frozen=True, slots=True)
class _Chosen:
    """Events chosen from a store read, and whether the size limit cut the read short."""

    events: list[WireEvent]
    cut: bool


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
        self,
        after: int,
        selection: Selection,
        limit: int,
        max_bytes: int,
        *,
        exhaustive: bool = False,
    ) -> Batch:
        """Up to ``limit`` events ``selection`` admits after ``after``, within ``max_bytes``
        of encoded events (at least one event, however large); ``exhaustive``: reading the
        store on to its end while they are none (see the module docstring)."""
        batch = self.feed.read(after, selection, limit, max_bytes)
        if batch is not None:
            return batch
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, self.read_store, after, selection, limit, max_bytes, exhaustive
        )

    def read_store(
        self,
        after: int,
        selection: Selection,
        limit: int,
        max_bytes: int,
        exhaustive: bool = False,
    ) -> Batch:
        """:meth:`read` from the store only (blocking)."""
        patterns = self._type_map.wanted_patterns(selection.want)
        if not patterns:
            return Batch([], max(after, self._store.last_position()))
        scanned = after
        reads = 0
        while exhaustive or reads < MAX_STORE_READS:
            reads += 1
            found = read_positions(self._store, scanned, limit, patterns)
            chosen = self._encoded(found.events, selection, max_bytes)
            if chosen.cut:
                return Batch(chosen.events, chosen.events[-1].position)
            scanned = found.scanned
            if chosen.events or len(found.events) < limit:
                return Batch(chosen.events, scanned)
        return Batch([], scanned)

    async def newest(self, selection: Selection, limit: int, max_bytes: int) -> Batch:
        """Of the newest ``limit`` events of the selected types, those ``selection`` admits,
        in id order, within ``max_bytes`` (the newest kept): where a live consumer without a
        position starts."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._newest, selection, limit, max_bytes)

    def _newest(self, selection: Selection, limit: int, max_bytes: int) -> Batch:
        patterns = self._type_map.wanted_patterns(selection.want)
        found = read_newest(self._store, limit, patterns) if patterns else []
        chosen = self._encoded(found[::-1], selection, max_bytes).events[::-1]
        return Batch(chosen, chosen[-1].position if chosen else 0)

    def _encoded(
        self, events: Sequence[StoredEvent], selection: Selection, max_bytes: int
    ) -> _Chosen:
        """The events ``selection`` admits, encoded, as many as fit ``max_bytes`` (at least
        one). Consumer events that a wide pattern selected are left out: no stream carries
        them (:meth:`.TypeMap.name_of`)."""
        chosen: list[WireEvent] = []
        size = 0
        for event in events:
            name = self._type_map.name_of(event.type)
            if name is None:
                continue
            encoded = wire_event(event, name)
            if not selection.admits(encoded):
                continue
            size += len(encoded.encoded) + 1
            if chosen and size > max_bytes:
                return _Chosen(chosen, True)
            chosen.append(encoded)
        return _Chosen(chosen, False)
