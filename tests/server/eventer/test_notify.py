"""The Eventer's notifier: batches reach subscribers in order, large ones encoded off the
loop, and a batch that cannot be encoded drops its subscribers instead of being skipped."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.waiting import run
from tidings.errors import ProtocolError
from tidings.events.matching import TypeMatcher
from tidings.events.model import EventId, PayloadKind, StoredEvent
from tidings.server.eventer.notify import INLINE_EVENTS, Notifier, notify_bodies


def _batch(first: int, count: int) -> list[StoredEvent]:
    return [
        StoredEvent(
            position=position,
            id=EventId(1, position, 0),
            type=("a", str(position % 3)),
            timestamp_us=1_700_000_000_000_000 + position,
            source_timestamp_us=None,
            payload=b"x" * 50,
            payload_kind=PayloadKind.BINARY,
            outbox_event_id=None,
        )
        for position in range(first, first + count)
    ]


def test_batches_reach_each_subscriber_in_order_whatever_their_size() -> None:
    """A large batch (encoded in a thread) is followed by small ones (which could have been
    encoded at once): each subscriber still gets them in the order they were stored."""
    batches = [_batch(1, 5), _batch(6, INLINE_EVENTS * 20), _batch(10_000, 3), _batch(10_003, 1)]
    everything = TypeMatcher([("a", "*")])
    zeros = TypeMatcher([("a", "0")])
    subscribers = [("all", everything), ("zeros", zeros)]

    async def main() -> list[tuple[str, bytes]]:
        sent: list[tuple[str, bytes]] = []
        notifier: Notifier[str] = Notifier(
            lambda who, body: sent.append((who, body)), lambda who, reason: None
        )
        for batch in batches:
            notifier.notify(batch, subscribers)
        while len(sent) < 2 * len(batches) - 1:  # batch 4 has no "a/0" event
            await asyncio.sleep(0.01)
        await notifier.aclose()
        return sent

    sent = run(main())
    expected = [pair for batch in batches for pair in notify_bodies(batch, subscribers)]
    assert sent == expected
    assert [who for who, _ in sent].count("zeros") == 3


def test_a_batch_that_cannot_be_encoded_drops_its_subscribers() -> None:
    """Fault injected with a matcher that raises (a real one cannot be made to fail): no
    subscriber silently misses the batch; each is handed to ``drop`` with the reason."""

    class Broken(TypeMatcher):
        def matches(self, event_type: tuple[str, ...]) -> bool:
            raise RuntimeError("injected")

    async def main() -> tuple[list[str], list[tuple[str, str]]]:
        sent: list[str] = []
        dropped: list[tuple[str, str]] = []
        notifier: Notifier[str] = Notifier(
            lambda who, body: sent.append(who), lambda who, reason: dropped.append((who, reason))
        )
        subscribers = [("fine", TypeMatcher([("a", "*")])), ("broken", Broken([("a", "*")]))]
        notifier.notify(_batch(1, 2), subscribers)  # inline
        notifier.notify(_batch(3, INLINE_EVENTS + 1), subscribers)  # in a thread
        while len(dropped) < 4:
            await asyncio.sleep(0.01)
        notifier.notify(_batch(1_000, 1), [("fine", TypeMatcher([("a", "*")]))])
        await notifier.aclose()
        return sent, dropped

    sent, dropped = run(main())
    assert sorted(who for who, _ in dropped) == ["broken", "broken", "fine", "fine"]
    assert all("notification failed: RuntimeError: injected" in r for _, r in dropped)
    assert sent == ["fine"]  # later batches are notified again


def test_an_event_that_cannot_be_encoded_fails_only_the_subscribers_that_select_it() -> None:
    """A stored SBS payload that is not a Hat.Data (anything may store bytes through the
    Python API) cannot be sent: the batch's other subscribers still get their events."""
    bad = StoredEvent(9, EventId(1, 9, 0), ("b",), 1, None, b"\x81", PayloadKind.SBS, None)
    batch = [*_batch(1, 2), bad]
    bodies = notify_bodies(batch, [("a only", TypeMatcher([("a", "*")]))])
    assert [who for who, _ in bodies] == ["a only"]
    with pytest.raises(ProtocolError, match=r"Hat\.Data"):
        notify_bodies(batch, [("everything", TypeMatcher([("*",)]))])
