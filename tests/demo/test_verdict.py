"""The demo's verdict on a reliable consumer: each kind of wrong delivery is caught."""

from __future__ import annotations

from tidings.demo.verdict import Committed, judge_consumer
from tidings.demo.watchers import ConsumerLog, Delivery

COMMITTED = [
    Committed("e1", "A", "AccountOpened", None),
    Committed("e2", "B", "AccountOpened", None),
    Committed("e3", "A", "MoneyWithdrawn", 500),
    Committed("e4", "B", "MoneyDeposited", None),
]


def _log(*ids: tuple[str, str]) -> ConsumerLog:
    log = ConsumerLog("C", push=True)
    log.deliveries = [Delivery(event_id, key, 1.0) for event_id, key in ids]
    return log


def test_every_event_once_in_key_order_passes_even_interleaved_across_keys() -> None:
    verdict = judge_consumer(_log(("e2", "B"), ("e1", "A"), ("e4", "B"), ("e3", "A")), COMMITTED)
    assert verdict.ok and (verdict.missing, verdict.extra, verdict.duplicates) == (0, 0, 0)
    assert verdict.received == 4 and len(verdict.latencies_ms) == 4


def test_a_missing_event_fails() -> None:
    verdict = judge_consumer(_log(("e1", "A"), ("e2", "B"), ("e3", "A")), COMMITTED)
    assert not verdict.ok and verdict.missing == 1


def test_an_event_nobody_committed_fails() -> None:
    log = _log(("e1", "A"), ("e2", "B"), ("e3", "A"), ("e4", "B"), ("rolled-back", "A"))
    verdict = judge_consumer(log, COMMITTED)
    assert not verdict.ok and verdict.extra == 1


def test_duplicates_are_counted_and_forgiven_by_event_id() -> None:
    log = _log(("e1", "A"), ("e2", "B"), ("e1", "A"), ("e3", "A"), ("e4", "B"), ("e3", "A"))
    verdict = judge_consumer(log, COMMITTED)
    assert verdict.ok and verdict.duplicates == 2


def test_a_key_out_of_order_by_first_delivery_fails() -> None:
    verdict = judge_consumer(_log(("e3", "A"), ("e1", "A"), ("e2", "B"), ("e4", "B")), COMMITTED)
    assert not verdict.ok and verdict.out_of_order == 1
