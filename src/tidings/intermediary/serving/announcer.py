"""Telling every subscriber that an upstream was lost or is back: :class:`StatusAnnouncer`.

Each upstream keeps its changes of staleness until read
(:class:`~tidings.intermediary.staleness.Staleness`); the serving loop reads them once a
tick and puts a ``status`` message (:func:`.envelope.status_message`) in the event ring for
each, so they reach every connection in order with the events. Where in the tick matters:
a loss is told before the tick's messages (the events that came after it follow its
``stale``), a return that ends the changes after them (its ``fresh`` follows the events that
caught up).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from tidings.intermediary.serving.envelope import status_message
from tidings.intermediary.serving.ring import EventRing
from tidings.intermediary.staleness import Staleness

#: Each upstream's name -> its staleness, asked every tick.
Upstreams = Callable[[], Mapping[str, Staleness]]


class StatusAnnouncer:
    """Announces the changes of ``upstreams`` into ``ring``; :attr:`told` is what the
    subscribers were told last (each stale upstream's name -> why), for a new
    connection's hello."""

    def __init__(self, ring: EventRing, upstreams: Upstreams | None) -> None:
        self.ring = ring
        self.upstreams = upstreams
        self.told: dict[str, str] = {}

    def before_tick(self) -> list[str]:
        """Announce each change since the last tick, in order, but a return that ends an
        upstream's changes: the upstreams whose return :meth:`after_tick` is to tell."""
        back: list[str] = []
        if self.upstreams is None:
            return back
        for name, staleness in self.upstreams().items():
            changes = staleness.changes()
            if changes[-1] is None:
                changes.pop()
                back.append(name)
            for why in changes:
                self._announce(name, why)
        return back

    def after_tick(self, back: list[str]) -> None:
        """Announce the returns :meth:`before_tick` left, after the tick's messages."""
        for name in back:
            self._announce(name, None)

    def _announce(self, name: str, why: str | None) -> None:
        """Tell every subscriber that upstream ``name`` is stale (``why``) or fresh (None),
        unless they were told so last."""
        if self.told.get(name) == why:
            return
        if why is None:
            del self.told[name]
        else:
            self.told[name] = why
        self.ring.append(json.dumps(status_message(name, why)), None)
