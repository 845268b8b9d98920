"""A stream's newest events in memory, in position order, shared by all of its consumers.

The engine tells its listeners of every stored batch in position order, whoever wrote it
(a session here, a Syncer peer, a relay appending to the same database: see
:mod:`tidings.server.async_engine`). The feed keeps the stream's events of the last
``capacity`` events, each encoded once (:mod:`tidings.streams.protocol.encoding`), and
wakes the push sessions waiting for new ones. It covers the positions ``(floor, high]``:
every event of the stream in that range is in memory, so a consumer whose position is at
least ``floor`` is served from here; one further behind reads the store (:mod:`.reader`).
Both give the same events in the same order, because the store's positions become visible
in increasing order.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from tidings.events.model import StoredEvent
from tidings.streams.protocol.encoding import WireEvent, wire_event
from tidings.streams.service.selection import Selection
from tidings.streams.typemap import TypeMap


@dataclass(frozen=True, slots=True)
class Batch:
    """Events after a position, in order, and how far the read looked (``scanned``):
    events up to it that are not in ``events`` were not selected (not wanted, or not for
    this consumer's user to read)."""

    events: list[WireEvent]
    scanned: int


class StreamFeed:
    """See the module docstring. Lives on the event loop; feed it with :meth:`add`."""

    def __init__(self, type_map: TypeMap, last_position: int, capacity: int = 20_000) -> None:
        self._type_map = type_map
        self._capacity = capacity
        #: Positions and events of the window; the live part starts at ``_start``.
        self._positions: list[int] = []
        self._events: list[WireEvent] = []
        self._start = 0
        self.floor = last_position
        self.high = last_position
        #: Called (on the loop) whenever the feed has seen new positions: the push
        #: sessions' wake-ups.
        self.waiters: set[Callable[[], None]] = set()

    def add(self, events: list[StoredEvent]) -> None:
        """A newly stored batch, in position order (the engine's listener)."""
        for event in events:
            if event.position <= self.high:
                continue  # read from the store at start-up already
            if event.position != self.high + 1:
                self._forget_all(event.position - 1)  # not dense: let the store serve the gap
            name = self._type_map.name_of(event.type)
            if name is not None:
                self._positions.append(event.position)
                self._events.append(wire_event(event, name))
            self.high = event.position
        if len(self._positions) - self._start > self._capacity:
            self._trim(len(self._positions) - self._start - self._capacity)
        if events:
            for wake in list(self.waiters):
                wake()

    def pending(self, after: int) -> int:
        """How many of the stream's events in memory lie after ``after``."""
        return len(self._positions) - bisect_right(self._positions, after, lo=self._start)

    def read(self, after: int, selection: Selection, limit: int, max_bytes: int) -> Batch | None:
        """Up to ``limit`` selected events after ``after`` within ``max_bytes`` (at least one
        event, however large); None if ``after`` is below what memory covers."""
        if after < self.floor:
            return None
        index = bisect_right(self._positions, after, lo=self._start)
        chosen: list[WireEvent] = []
        size = 0
        events = self._events
        while index < len(events):
            event = events[index]
            index += 1
            if not selection.admits(event):
                continue
            size += len(event.encoded) + 1
            if chosen and size > max_bytes:
                return Batch(chosen, chosen[-1].position)
            chosen.append(event)
            if len(chosen) == limit:
                return Batch(chosen, event.position)
        return Batch(chosen, self.high)

    def newest(self, count: int) -> int:
        """The position after which the newest ``count`` of the stream's events in memory
        lie (where a live consumer starts, or skips to)."""
        index = max(self._start, len(self._positions) - count)
        return self._positions[index - 1] if index > self._start else self.floor

    def _forget_all(self, position: int) -> None:
        self._positions.clear()
        self._events.clear()
        self._start = 0
        self.floor = self.high = position

    def _trim(self, count: int) -> None:
        self._start += count
        self.floor = self._positions[self._start - 1]
        if self._start > len(self._positions) // 2:
            del self._positions[: self._start]
            del self._events[: self._start]
            self._start = 0
