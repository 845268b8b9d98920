"""What an intermediary has seen of an event server's log, so it can resynchronise after losing
the connection without folding anything twice or missing anything.

Event ids are ``(server, session, instance)``: within one server's events they grow in the
order the server stored them, and a server of a redundant group passes its peers' events on
with their own ids (the Syncer keeps them). So the mark is kept per originating server
(:class:`Watermark`): an event is new if its id is past the mark of its server. Ids of two
servers are never compared, which is what lets an intermediary move to a peer.

A query cannot ask for "events after this id", only for events from a timestamp on
(inclusive). A server stamps its events with its own clock, not decreasing along its ids, so
the resynchronising query asks from the oldest of the per-server marks' timestamps
(:meth:`Watermark.since`) and the mark drops what was seen. A server none of whose events was
seen has sent none before the loss, so its events are covered from the moment the connection
was lost, less :data:`CLOCK_SLACK_US` for the clocks of two machines. The cost: a server whose
last event is old makes the query reach back to it (the mark drops what it re-reads).
"""

from __future__ import annotations

from collections.abc import Iterable

from tidings.events import EventId, StoredEvent

#: How far the server's clock may be behind the intermediary's, in microseconds, for a
#: server whose events were never seen (see the module's docstring).
CLOCK_SLACK_US = 5_000_000


class Watermark:
    """Per originating server, the newest event id taken and its timestamp."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[tuple[int, int], int]] = {}

    def __bool__(self) -> bool:
        return bool(self._last)

    def is_new(self, event_id: EventId) -> bool:
        last = self._last.get(event_id.server)
        return last is None or (event_id.session, event_id.instance) > last[0]

    def take(self, events: Iterable[StoredEvent]) -> list[StoredEvent]:
        """The events past the mark, in the order given; the mark moves past them."""
        fresh = []
        for event in events:
            if self.is_new(event.id):
                fresh.append(event)
                self._last[event.id.server] = (
                    (event.id.session, event.id.instance),
                    event.timestamp_us,
                )
        return fresh

    def since(self, lost_at_us: int) -> int:
        """The timestamp from which a query holds every event not taken yet: the oldest
        per-server mark, or the loss (``lost_at_us``, the intermediary's clock) less the
        slack if that is older (a server not seen yet may have stored events since then)."""
        return min([lost_at_us - CLOCK_SLACK_US, *(ts for _, ts in self._last.values())])
