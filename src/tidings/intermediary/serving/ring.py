"""The one ring of event messages every connection of an intermediary's server reads from
(issue 30's never-reading subscribers): an event is written to JSON once and appended once,
with its route (which subscribers' keys it is for); each connection keeps a cursor into the
ring and its writer walks it, sending what is for it, only while its transport takes what it
sends. So an event costs the serving loop O(1), whoever subscribed to it, and a subscriber
that never reads costs O(1) a tick (its writer sits in one send, its cursor stays), not one
queued message per event: queueing each event per subscriber stalled every other subscriber
for seconds in the hostile benchmark.

The ring is bounded like a connection's backlog used to be (``max_queued_messages`` from
earlier ticks, ``max_queued_bytes``): past either, its oldest entries are dropped at the end
of the tick (:meth:`EventRing.trim`), and a connection whose cursor was among them and which
lost an entry meant for it is closed as too slow (:func:`.connection.catch_up`), so no
subscriber has a silent gap. Entries every connection has passed are dropped then too
(:meth:`EventRing.forget`): when everyone reads, the ring holds about one tick.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

#: An entry's route: subscriber -> its keys the event is sent under (None: every connection,
#: the text as it is: a status message).
Route = Mapping[Hashable, tuple[str, ...]] | None


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of the ring: its JSON (an event's without the key), its route, and the
    bytes appended to the ring before it (so a cursor's backlog is weighed in O(1))."""

    body: str
    route: Route
    before: int


class EventRing:
    """Entries by sequence number, ``start`` to ``end`` (exclusive), bounded at each tick's
    end by :meth:`trim`."""

    def __init__(self, max_messages: int = 10_000, max_bytes: int | None = None) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.entries: dict[int, Entry] = {}
        self.start = 0
        #: Bytes ever appended, and ever dropped.
        self.appended = 0
        self.dropped = 0
        #: Where the tick under way began appending (entries before it are "earlier ticks").
        self.tick_start = 0

    @property
    def end(self) -> int:
        return self.start + len(self.entries)

    @property
    def bytes(self) -> int:
        """What the ring holds, in bytes of JSON."""
        return self.appended - self.dropped

    def append(self, body: str, route: Route) -> None:
        """Add one message at the end."""
        self.entries[self.end] = Entry(body, route, self.appended)
        self.appended += len(body)

    def behind(self, cursor: int) -> int:
        """The bytes from ``cursor`` to the end (what a connection there has not sent yet)."""
        entry = self.entries.get(cursor)
        return 0 if entry is None else self.appended - entry.before

    def forget(self, upto: int) -> None:
        """Drop the entries before ``upto``, which every connection has passed."""
        while self.start < upto and self.entries:
            self.dropped += len(self.entries.pop(self.start).body)
            self.start += 1

    def trim(self) -> tuple[list[Entry], str]:
        """End the tick: drop the oldest entries while more than ``max_bytes`` are held, or
        more than ``max_messages`` from earlier ticks; returns them (oldest first) and the
        reason a connection that lost one of its own is closed with."""
        dropped: list[Entry] = []
        reason = ""
        while self.entries:
            if self.max_bytes is not None and self.bytes > self.max_bytes:
                reason = reason or f"too slow: more than {self.max_bytes} bytes waiting to be sent"
            elif self.tick_start - self.start > self.max_messages:
                reason = reason or (
                    f"too slow: more than {self.max_messages} messages waiting to be sent"
                )
            else:
                break
            entry = self.entries.pop(self.start)
            self.start += 1
            self.dropped += len(entry.body)
            dropped.append(entry)
        self.tick_start = self.end
        return dropped, reason
