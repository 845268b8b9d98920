"""The events a server of the group confirmed lately, kept to be sent again after a move.

Servers of a group copy each other's events asynchronously (the Syncer). When the server in
use dies, the events it confirmed during its last moments may not have reached its peers
yet; they come back only when it does (never, if its disk is lost). Meanwhile the target
publishes the later events of the same keys to a peer, which then serves them without the
earlier ones and, when the dead server returns and syncs, stores the earlier ones after
them. So the ``event_server`` target, on a new connection, sends the events confirmed shortly
before again first, in log order (``seq``: each key's events in the order the relay handed
them to the target): the new server stores what it lacks and recognises the rest by
outbox id.

What was confirmed comes from two places, merged by :func:`resend_list`: the outbox log,
which records every relay task's confirmations, whatever process made them
(:mod:`tidings.outbox.confirmations`), and this module's :class:`ResendWindow`, the memory
of one target instance: what its process confirmed and has not recorded yet (a task
records its outcomes about once a second), and what it sent again at its last move (the
new server's own sync of those starts then, so their age starts again too).

Both are bounded by age (the Syncer's lag they are meant to cover), by event count and by
payload bytes, whichever is reached first; the oldest events leave first.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from tidings.errors import TargetUnavailable
from tidings.events.model import NewEvent
from tidings.events.outbox import OutboxEvent
from tidings.outbox.confirmations import newest_within
from tidings.targets.destination import RenderError

if TYPE_CHECKING:
    from tidings.outbox.confirmations import ConfirmationLog

#: An event confirmed at the target: its outbox ``seq`` (its place in the log) and the
#: server event it became.
Confirmed = tuple[int, NewEvent]


def weight(event: NewEvent) -> int:
    """About how many bytes ``event`` takes in a register request (and in the window)."""
    return len(event.payload or b"") + sum(map(len, event.type)) + 64


def resend_list(
    recorded: Iterable[Confirmed],
    remembered: Iterable[Confirmed],
    max_events: int,
    max_bytes: int,
) -> list[Confirmed]:
    """What a new connection gets first: the events the log ``recorded`` and those this
    target ``remembered``, each once (by outbox id), in log order, the newest ``max_events``
    of them, fewer past ``max_bytes``.

    Log order, not the order each source has: the window may hold an event sent again at
    an earlier move that the log's window has left, while the log holds a later event of
    its key that another process confirmed since. Dropping the oldest keeps, per key, its
    latest events, never a later one without those between."""
    merged: dict[str | None, Confirmed] = {}
    for seq, event in (*recorded, *remembered):
        merged.setdefault(event.outbox_event_id, (seq, event))
    newest_first = sorted(merged.values(), key=lambda entry: entry[0], reverse=True)
    return newest_within(newest_first, lambda entry: weight(entry[1]), max_events, max_bytes)


class ResendWindow:
    """Confirmed events (with their ``seq``), oldest first, dropped once older than
    ``seconds`` or beyond ``max_events`` / ``max_bytes``. Not thread-safe: its target uses
    it under its lock."""

    def __init__(
        self,
        seconds: float,
        max_events: int,
        max_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seconds = seconds
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: deque[tuple[float, int, Confirmed]] = deque()  # (confirmed at, weight, e)
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, events: Iterable[Confirmed]) -> None:
        """``events``, just confirmed by the server in use, in the order it confirmed them."""
        if self.seconds <= 0:
            return
        now = self._clock()
        for entry in events:
            size = weight(entry[1])
            self._entries.append((now, size, entry))
            self._bytes += size
        self._trim(now)

    def with_recorded(self, recorded: Iterable[Confirmed]) -> list[Confirmed]:
        """What a new connection gets first: ``recorded`` and this window merged
        (:func:`resend_list`) within the window's bounds."""
        return resend_list(recorded, self.events(), self.max_events, self.max_bytes)

    def events(self) -> list[Confirmed]:
        """The events still in the window, in the order they were confirmed."""
        self._trim(self._clock())
        return [entry for _, _, entry in self._entries]

    def renew(self, events: Iterable[Confirmed]) -> None:
        """``events`` were just confirmed again, by the server now in use, and become the
        window: that server's own sync of them to its peers starts now, so their age starts
        again too."""
        self.clear()
        self.add(events)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _trim(self, now: float) -> None:
        entries = self._entries
        while entries and (
            now - entries[0][0] > self.seconds
            or len(entries) > self.max_events
            or self._bytes > self.max_bytes
        ):
            self._bytes -= entries.popleft()[1]


async def read_recorded(
    log: ConfirmationLog | None,
    target: str,
    window: ResendWindow,
    convert: Callable[[OutboxEvent], NewEvent],
    timeout: float,
) -> list[Confirmed]:
    """The events ``log`` records as confirmed at ``target`` within ``window``'s bounds, as
    the target sends them (``convert``); :class:`~tidings.errors.TargetUnavailable` if the
    log cannot be read within ``timeout`` seconds (better held than sent out of order);
    none without a log (a target the relay does not run) or with a window of 0."""
    if log is None or window.seconds <= 0:
        return []
    try:
        async with asyncio.timeout(timeout):
            found = await asyncio.to_thread(
                log.recent, target, window.seconds, window.max_events, window.max_bytes
            )
    except (SQLAlchemyError, TimeoutError) as exc:
        raise TargetUnavailable(
            f"event server target {target!r}: cannot read the events confirmed before from "
            f"the outbox log, to send them again first: {type(exc).__name__}: {exc}"
        ) from exc
    recorded: list[Confirmed] = []
    for event in found:
        try:
            recorded.append((event.seq, convert(event)))
        except RenderError:  # it never had a type here, so it was never confirmed here
            continue
    return recorded
