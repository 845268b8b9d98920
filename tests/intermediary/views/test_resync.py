"""The per-server watermark an intermediary resynchronises from."""

from __future__ import annotations

from tidings.events.model import EventId, StoredEvent
from tidings.intermediary.views.resync import CLOCK_SLACK_US, Watermark


def _event(server: int, session: int, instance: int, timestamp_us: int) -> StoredEvent:
    return StoredEvent(
        0, EventId(server, session, instance), ("a",), timestamp_us, None, None, None, None
    )


def test_each_server_has_its_own_mark_and_seen_events_are_dropped() -> None:
    mark = Watermark()
    first = [_event(1, 1, 1, 100), _event(1, 1, 2, 100), _event(2, 9, 1, 50)]
    assert mark.take(first) == first
    # Again, with one new event of each server: only those pass, in the order given.
    again = [*first, _event(2, 9, 2, 60), _event(1, 2, 1, 200)]
    assert mark.take(again) == again[3:]
    assert not mark.is_new(EventId(1, 2, 1)) and mark.is_new(EventId(3, 1, 1))


def test_since_reaches_back_to_the_oldest_mark_or_the_loss_less_the_slack() -> None:
    mark = Watermark()
    assert mark.since(10_000_000) == 10_000_000 - CLOCK_SLACK_US
    mark.take([_event(1, 1, 1, 9_000_000), _event(2, 1, 1, 1_000)])
    assert mark.since(10_000_000) == 1_000
