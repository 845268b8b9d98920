"""The events a server of the group confirmed lately, kept to be sent again after a move.

Servers of a group copy each other's events asynchronously (the Syncer). When the server in
use dies, the events it confirmed during its last moments may not have reached its peers
yet; they come back only when it does (never, if its disk is lost). Meanwhile the target
publishes the later events of the same keys to a peer, which then serves them without the
earlier ones and, when the dead server returns and syncs, stores the earlier ones after
them. So the ``event_server`` target keeps what its server confirmed within a short window
and, on a new connection, sends that again first, in the order it was confirmed (each
key's events in log order, since the relay hands a target a key's events in that order):
the new server stores what it lacks and recognises the rest by outbox id.

The window is bounded by age (the Syncer's lag it is meant to cover), by event count and by
payload bytes, whichever is reached first; the oldest events leave first. It is memory of
one target instance, i.e. of one Python process (see the event-server target's docs).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

from tidings.events.model import NewEvent


def weight(event: NewEvent) -> int:
    """About how many bytes ``event`` takes in a register request (and in the window)."""
    return len(event.payload or b"") + sum(map(len, event.type)) + 64


class ResendWindow:
    """Confirmed events, oldest first, dropped once older than ``seconds`` or beyond
    ``max_events`` / ``max_bytes``. Not thread-safe: its target uses it under its lock."""

    def __init__(
        self,
        seconds: float,
        max_events: int,
        max_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._seconds = seconds
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._clock = clock
        self._entries: deque[tuple[float, int, NewEvent]] = deque()  # (confirmed at, weight, e)
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, events: Iterable[NewEvent]) -> None:
        """``events``, just confirmed by the server in use, in the order it confirmed them."""
        if self._seconds <= 0:
            return
        now = self._clock()
        for event in events:
            size = weight(event)
            self._entries.append((now, size, event))
            self._bytes += size
        self._trim(now)

    def events(self) -> list[NewEvent]:
        """The events still in the window, in the order they were confirmed."""
        self._trim(self._clock())
        return [event for _, _, event in self._entries]

    def renew(self) -> None:
        """The events in the window were just confirmed again, by the server now in use: its
        own sync of them to its peers starts now, so their age starts again too."""
        now = self._clock()
        self._entries = deque((now, size, event) for _, size, event in self._entries)
        self._trim(now)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _trim(self, now: float) -> None:
        entries = self._entries
        while entries and (
            now - entries[0][0] > self._seconds
            or len(entries) > self._max_events
            or self._bytes > self._max_bytes
        ):
            self._bytes -= entries.popleft()[1]
