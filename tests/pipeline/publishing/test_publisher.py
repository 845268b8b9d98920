"""The delivery algorithm, run directly (no Spark) against real SQLite files.

Failures are injected with the fault file of :mod:`tidings.targets.faults`, or with the
small ``Refusing`` target below: a real target cannot be made to refuse one chosen event.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import Engine

from tests.support.publisher_helpers import (
    Refusing,
    SteppedClock,
    emit_all,
    local_store,
    logged_rows,
    rows_by_seq,
    stored_seqs,
)
from tidings.config import load_config
from tidings.errors import TargetCallFailed, TargetUnavailable
from tidings.events.outbox import EventStatus, OutboxEvent
from tidings.outbox.schema import outbox_event
from tidings.pipeline.publishing.breaker import FAILED_CALLS_TO_OPEN, CircuitBreaker
from tidings.pipeline.publishing.delivery import Delivery, Unit
from tidings.pipeline.publishing.outcome import Summary
from tidings.pipeline.publishing.publisher import Publisher
from tidings.pipeline.publishing.retry import RetryPolicy
from tidings.pipeline.status import health_report
from tidings.routing.table import merge_routes
from tidings.targets.base import Target
from tidings.targets.faults import FaultInjectingTarget


def test_one_type_to_many_targets_and_unroutable(engine: Engine, tmp_path: Path) -> None:
    emit_all(engine, [("A", "k", {"n": 1}), ("B", "k", {"n": 2}), ("Nowhere", "k", {"n": 3})])
    a, b = local_store(tmp_path, "a"), local_store(tmp_path, "b")
    targets = {"a": a, "b": b}
    routes = merge_routes({"A": ["a", "b"], "B": ["b"]})
    summary = Publisher(engine, routes, targets.get, [0.0]).run(logged_rows(engine))
    rows = rows_by_seq(engine)
    assert [rows[s].status for s in (1, 2, 3)] == ["PUBLISHED", "PUBLISHED", "UNROUTABLE"]
    assert "no route for event type 'Nowhere'" in rows[3].error_details
    assert set(json.loads(rows[1].deliveries)) == {"a", "b"}
    assert stored_seqs(a, engine) == [1] and stored_seqs(b, engine) == [1, 2]
    assert (summary.published, summary.unroutable) == (2, 1)
    # Running again changes nothing: final rows are skipped, nothing is re-sent.
    again = Publisher(engine, routes, targets.get, [0.0]).run(logged_rows(engine))
    assert again.skipped == 3 and stored_seqs(b, engine) == [1, 2]


def test_retry_goes_only_to_the_failed_target_with_growing_backoff(
    engine: Engine, tmp_path: Path
) -> None:
    emit_all(engine, [("A", "k", {"n": 1})])
    fault = tmp_path / "b.fault"
    fault.write_text("2")  # the next two calls to b fail
    a = local_store(tmp_path, "a")
    b = FaultInjectingTarget(local_store(tmp_path, "b"), str(fault))
    calls: list[str] = []
    for t in (a, b):
        original = t.publish
        t.publish = lambda events, t=t, original=original: (calls.append(t.name), original(events))[
            1
        ]
    clock = SteppedClock()
    routes = merge_routes({"A": ["a", "b"]})
    Publisher(
        engine,
        routes,
        {"a": a, "b": b}.get,
        [0.01, 0.025, 0.04],
        clock=clock.time,
        sleep=clock.sleep,
    ).run(logged_rows(engine))
    assert clock.slept == [0.01, 0.025]
    assert calls.count("a") == 1 and calls.count("b") == 3
    row = rows_by_seq(engine)[1]
    assert row.status == "PUBLISHED" and row.retry_count == 2


def test_failed_after_retry_limit_with_error_details(engine: Engine, tmp_path: Path) -> None:
    emit_all(engine, [("A", "k", {"n": 1})])
    fault = tmp_path / "a.fault"
    fault.write_text("down")
    a = FaultInjectingTarget(local_store(tmp_path, "a"), str(fault))
    clock = SteppedClock()
    Publisher(
        engine,
        merge_routes({"A": ["a"]}),
        {"a": a}.get,
        [0.01, 0.025, 0.04],
        clock=clock.time,
        sleep=clock.sleep,
    ).run(logged_rows(engine))
    row = rows_by_seq(engine)[1]
    assert clock.slept == [0.01, 0.025, 0.04]
    assert row.status == "FAILED" and row.retry_count == 3
    assert "injected failure" in json.loads(row.error_details)["a"]
    assert json.loads(row.deliveries)["a"]["state"] == "failed"


def test_key_with_failed_event_holds_later_ones_other_keys_go_on(
    engine: Engine, tmp_path: Path
) -> None:
    emit_all(
        engine,
        [
            ("A", "k1", {"n": "poison"}),
            ("A", "k2", {"n": 1}),
            ("A", "k1", {"n": 2}),
            ("A", "k2", {"n": 3}),
            ("A", None, {"n": 4}),
        ],
    )
    store = local_store(tmp_path, "a")
    refusing = Refusing("a", store, "poison")
    Publisher(engine, merge_routes({"A": ["a"]}), {"a": refusing}.get, [0.0]).run(
        logged_rows(engine)
    )
    rows = rows_by_seq(engine)
    assert [rows[s].status for s in range(1, 6)] == [
        "FAILED",
        "PUBLISHED",
        "HELD",
        "PUBLISHED",
        "PUBLISHED",
    ]
    assert "seq 1" in rows[3].error_details
    assert sorted(stored_seqs(store, engine)) == [2, 4, 5]  # keys interleave freely
    # A later batch with a new k1 event is held behind the failed one (outside its set).
    emit_all(engine, [("A", "k1", {"n": 5}), ("A", "k2", {"n": 6})])
    later = [e for e in logged_rows(engine) if e.event.seq > 5]
    Publisher(engine, merge_routes({"A": ["a"]}), {"a": refusing}.get, [0.0]).run(later)
    rows = rows_by_seq(engine)
    assert rows[6].status == "HELD" and rows[7].status == "PUBLISHED"
    # Once the target accepts it again, a replay-like pass delivers k1 in log order.
    refusing.word = "never-matches"
    Publisher(engine, merge_routes({"A": ["a"]}), {"a": refusing}.get, [0.0]).run(
        [e for e in logged_rows(engine) if e.status in (EventStatus.FAILED, EventStatus.HELD)]
    )
    assert all(r.status == "PUBLISHED" for r in rows_by_seq(engine).values())
    stored = stored_seqs(store, engine)
    assert sorted(stored) == [1, 2, 3, 4, 5, 6, 7]
    keys = {seq: row.partition_key for seq, row in rows_by_seq(engine).items()}
    assert [s for s in stored if keys[s] == "k1"] == [1, 3, 6]
    assert [s for s in stored if keys[s] == "k2"] == [2, 4, 7]


def test_non_atomic_target_never_gets_two_events_of_a_key_in_one_call(
    engine: Engine, tmp_path: Path
) -> None:
    emit_all(engine, [("A", "k1", {}), ("A", "k1", {}), ("A", "k2", {}), ("A", "k1", {})])
    refusing = Refusing("a", local_store(tmp_path, "a"), "nothing")
    refusing.atomic = False
    Publisher(engine, merge_routes({"A": ["a"]}), {"a": refusing}.get, [0.0]).run(
        logged_rows(engine)
    )
    assert refusing.calls == [[1, 3], [2], [4]]


class Chaining(Refusing):
    """A target that takes up to three of a key's events per call and, like the JetStream
    target, sends none of a key's events after one of them was refused."""

    events_per_key = 3

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        self.calls.append([e.seq for e in events])
        refused: dict[str, int] = {}  # key -> its first refused seq in this call
        for e in events:
            if self.word in e.payload:
                refused.setdefault(e.ordering_key, e.seq)
        sent = [e for e in events if e.seq < refused.get(e.ordering_key, e.seq + 1)]
        stored = dict(zip([e.seq for e in sent], self.inner.publish(sent), strict=True))
        return [
            stored[e.seq]
            if e.seq in stored
            else f"refused {e.seq}"
            if refused[e.ordering_key] == e.seq
            else f"not sent after {refused[e.ordering_key]}"
            for e in events
        ]


def test_a_target_that_chains_a_key_gets_bounded_runs_and_the_first_failure_is_blamed(
    engine: Engine, tmp_path: Path
) -> None:
    k1 = [("A", "k1", {"n": n}) for n in ("ok", "poison", "ok", "ok")]
    emit_all(engine, k1 + [("A", "k2", {"n": n}) for n in range(5)])  # k1: 1-4, k2: 5-9
    store = local_store(tmp_path, "a")
    chaining = Chaining("a", store, "poison")
    Publisher(engine, merge_routes({"A": ["a"]}), {"a": chaining}.get, [0.0]).run(
        logged_rows(engine)
    )
    assert chaining.calls[0] == [1, 2, 3, 5, 6, 7]  # a run per key, three at most, in order
    assert all(len([s for s in call if s <= 4]) <= 3 for call in chaining.calls)
    for call in chaining.calls:  # each key's events in log order
        assert [s for s in call if s <= 4] == sorted(s for s in call if s <= 4)
        assert [s for s in call if s > 4] == sorted(s for s in call if s > 4)
    rows = rows_by_seq(engine)
    assert [rows[s].status for s in range(1, 10)] == ["PUBLISHED", "FAILED", "HELD", "HELD"] + [
        "PUBLISHED"
    ] * 5
    assert rows[3].retry_count == 0 and rows[4].retry_count == 0  # not sent is not charged
    assert "seq 2" in rows[3].error_details and "seq 2" in rows[4].error_details
    assert sorted(stored_seqs(store, engine)) == [1, 5, 6, 7, 8, 9]


def test_a_chained_run_confirmed_before_its_failure_keeps_the_breaker_closed(
    engine: Engine, tmp_path: Path
) -> None:
    """Calls for two keys whose runs each fail after a confirmed event reached the target:
    a breaker that counted them as failed calls would take it for down (three calls, two
    keys) and hold every key."""
    emit_all(engine, [("A", k, {"n": n}) for n in ("ok", "poison") for k in ("k1", "k2")])
    chaining = Chaining("a", local_store(tmp_path, "a"), "poison")
    breaker = CircuitBreaker("a")
    delivery = Delivery({"a": chaining}.get, RetryPolicy.of([0.0]), breakers=lambda _: breaker)
    for _ in range(FAILED_CALLS_TO_OPEN):
        rows = logged_rows(engine)
        units = [Unit(k, [r for r in rows if r.event.partition_key == k]) for k in ("k1", "k2")]
        delivery.deliver({"a": units}, Summary())
        assert [u.culprit.event.seq for u in units if u.culprit] == [3, 4]
    assert chaining.calls[-1] == [1, 3, 2, 4]
    assert not breaker.is_open


def test_a_chained_run_stops_before_an_event_that_failed_before(
    engine: Engine, tmp_path: Path
) -> None:
    """Seq 2 failed at the target in an earlier run: it goes as the head of a run (through
    the retry checks, charged as a retry), not as the tail of seq 1's."""
    emit_all(engine, [("A", "k", {"n": n}) for n in range(3)])
    failed = {"a": {"state": "failed", "error": "earlier", "failures": 1, "retry_at": 0}}
    with engine.begin() as conn:
        conn.execute(
            outbox_event.update()
            .where(outbox_event.c.seq == 2)
            .values(deliveries=json.dumps(failed))
        )
    chaining = Chaining("a", local_store(tmp_path, "a"), "never-matches")
    Publisher(engine, merge_routes({"A": ["a"]}), {"a": chaining}.get, [0.0, 0.0]).run(
        logged_rows(engine)
    )
    assert chaining.calls == [[1], [2, 3]]
    rows = rows_by_seq(engine)
    assert [rows[s].status for s in (1, 2, 3)] == ["PUBLISHED"] * 3
    assert (rows[2].retry_count, rows[3].retry_count) == (1, 0)


def test_retry_threshold_skips_and_keeps_later_events_held(engine: Engine, tmp_path: Path) -> None:
    emit_all(engine, [("A", "k", {}), ("A", "k", {})])
    with engine.begin() as conn:
        conn.execute(
            outbox_event.update()
            .where(outbox_event.c.seq == 1)
            .values(status="FAILED", retry_count=9)
        )
        conn.execute(outbox_event.update().where(outbox_event.c.seq == 2).values(status="HELD"))
    store = local_store(tmp_path, "a")
    Publisher(engine, merge_routes({"A": ["a"]}), {"a": store}.get, [0.0], retry_threshold=5).run(
        logged_rows(engine)
    )
    rows = rows_by_seq(engine)
    assert (rows[1].status, rows[2].status) == ("FAILED", "HELD")
    assert stored_seqs(store, engine) == []


def test_unknown_target_in_a_route_fails_the_event(engine: Engine, tmp_path: Path) -> None:
    emit_all(engine, [("A", "k", {})])
    Publisher(engine, merge_routes({"A": ["ghost"]}), {}.get, []).run(logged_rows(engine))
    row = rows_by_seq(engine)[1]
    assert row.status == "FAILED" and "unknown target 'ghost'" in row.error_details


def test_delete_on_success_removes_published_rows_only(engine: Engine, tmp_path: Path) -> None:
    emit_all(engine, [("A", "k", {"n": "poison"}), ("A", "j", {}), ("B", "j", {})])
    refusing = Refusing("a", local_store(tmp_path, "a"), "poison")
    Publisher(
        engine, merge_routes({"A": ["a"]}), {"a": refusing}.get, [0.0], delete_published=True
    ).run(logged_rows(engine))
    assert {s: r.status for s, r in rows_by_seq(engine).items()} == {1: "FAILED", 3: "UNROUTABLE"}


# -- failures charged to their cause, targets that are down ----------------------------------


class CallFailing(Target):
    """Fault injection: like a broker that drops the connection when one message is bad, it
    fails a whole call that holds the poison (a real target cannot be made to do so on cue:
    tidings' own targets check sizes before sending)."""

    def __init__(self, name: str, inner: Target, word: str, *, atomic: bool) -> None:
        super().__init__(name)
        self.inner, self.word, self.atomic, self.calls = inner, word, atomic, []

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        self.calls.append([e.seq for e in events])
        if any(self.word in e.payload for e in events):
            raise TargetCallFailed(f"connection closed by {self.name}")
        return self.inner.publish(events)


class Switchable(Target):
    """Fault injection: a target that is down (nothing can be sent) until switched on."""

    def __init__(self, name: str, inner: Target) -> None:
        super().__init__(name)
        self.inner, self.atomic, self.up, self.calls = inner, inner.atomic, False, 0

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        self.calls += 1
        if not self.up:
            raise TargetUnavailable(f"{self.name} refused the connection")
        return self.inner.publish(events)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _fresh_breakers(clock: Clock | None = None):
    made: dict[str, CircuitBreaker] = {}

    def lookup(target: Target) -> CircuitBreaker:
        if target.name not in made:
            made[target.name] = CircuitBreaker(target.name, clock or time.monotonic)
        return made[target.name]

    return lookup


def test_a_call_failing_as_a_whole_is_narrowed_to_the_culprit(
    engine: Engine, tmp_path: Path
) -> None:
    events = [("A", f"k{k}", {"k": k}) for k in range(16)]
    events[9] = ("A", "k9", {"n": "poison"})
    emit_all(engine, [*events, ("A", "k9", {"after": 1})])
    target = CallFailing("a", local_store(tmp_path, "a"), "poison", atomic=False)
    Publisher(
        engine,
        merge_routes({"A": ["a"]}),
        {"a": target}.get,
        [0.0, 0.0],
        breakers=_fresh_breakers(),
    ).run(logged_rows(engine))
    rows = rows_by_seq(engine)
    assert rows[10].status == "FAILED" and rows[10].retry_count == 2
    assert "connection closed by a" in json.loads(rows[10].error_details)["a"]
    assert rows[17].status == "HELD" and "seq 10" in rows[17].error_details
    innocent = [r for s, r in rows.items() if s not in (10, 17)]
    assert {r.status for r in innocent} == {"PUBLISHED"}
    assert all(r.retry_count == 0 for r in innocent)
    assert sorted(stored_seqs(target, engine)) == [s for s in range(1, 17) if s != 10]
    # halving: 16 → 8 → 4 → 2 → 1, each failing half split again, then two retries alone
    assert len(target.calls) <= 2 * 4 + 1 + 2


def test_an_atomic_run_is_narrowed_in_log_order(engine: Engine, tmp_path: Path) -> None:
    emit_all(
        engine,
        [
            ("A", "k", {"n": 1}),
            ("A", "k", {"n": 2}),
            ("A", "k", {"n": "poison"}),
            ("A", "k", {"n": 4}),
            ("A", "j", {"n": 5}),
        ],
    )
    target = CallFailing("a", local_store(tmp_path, "a"), "poison", atomic=True)
    Publisher(
        engine,
        merge_routes({"A": ["a"]}),
        {"a": target}.get,
        [0.0],
        breakers=_fresh_breakers(),
    ).run(logged_rows(engine))
    rows = rows_by_seq(engine)
    assert [rows[s].status for s in range(1, 6)] == [
        "PUBLISHED",
        "PUBLISHED",
        "FAILED",
        "HELD",
        "PUBLISHED",
    ]
    assert stored_seqs(target, engine) in ([1, 2, 5], [5, 1, 2])
    assert [r.retry_count for r in rows.values()] == [0, 0, 1, 0, 0]


def test_a_target_that_is_down_holds_without_charging_and_resumes_in_order(
    engine: Engine, tmp_path: Path
) -> None:
    emit_all(engine, [("A", f"k{i % 3}", {"i": i}) for i in range(9)])
    up = local_store(tmp_path, "up")
    down = Switchable("down", local_store(tmp_path, "down"))
    clock = Clock()
    breakers = _fresh_breakers(clock)
    targets = {"up": up, "down": down}
    routes = merge_routes({"A": ["up", "down"]})
    stepped = SteppedClock()
    Publisher(
        engine,
        routes,
        targets.get,
        [0.01, 0.02],
        breakers=breakers,
        clock=stepped.time,
        sleep=stepped.sleep,
    ).run(logged_rows(engine))
    rows = rows_by_seq(engine)
    # The healthy target got everything, in order; the down one was called once, no retries.
    assert _per_key(stored_seqs(up, engine)) == _per_key(list(range(1, 10)))
    assert down.calls == 1 and stepped.slept == []
    assert {r.status for r in rows.values()} == {"HELD"}
    assert all(r.retry_count == 0 for r in rows.values())
    assert all(json.loads(r.deliveries)["up"]["state"] == "confirmed" for r in rows.values())
    assert "'down' is unavailable" in rows[1].error_details
    # Still down to the breaker: no call at all within its pause.
    Publisher(engine, routes, targets.get, [0.0], breakers=breakers).run(logged_rows(engine))
    assert down.calls == 1
    # Back, and the pause is over: a probe, then every held key resumes in key order.
    down.up = True
    clock.now += 10
    Publisher(engine, routes, targets.get, [0.0], breakers=breakers).run(logged_rows(engine))
    assert {r.status for r in rows_by_seq(engine).values()} == {"PUBLISHED"}
    assert _per_key(stored_seqs(down, engine)) == _per_key(list(range(1, 10)))
    assert len(stored_seqs(up, engine)) == 9  # nothing re-sent to the healthy one


def _per_key(seqs: list[int]) -> list[list[int]]:
    """Seqs of the test's three keys (k0 = seqs 1, 4, 7, ...), each in the order given."""
    return [[s for s in seqs if (s - 1) % 3 == k] for k in range(3)]


def test_the_relay_waits_each_retry_pause_then_stops_a_replay_tries_at_once(
    engine: Engine, tmp_path: Path
) -> None:
    emit_all(engine, [("A", "k", {"n": "poison"}), ("A", "k", {"n": 2}), ("A", "j", {"n": 3})])
    refusing = Refusing("a", local_store(tmp_path, "a"), "poison")
    routes = merge_routes({"A": ["a"]})
    clock = SteppedClock()

    def run(**options) -> None:
        Publisher(
            engine,
            routes,
            {"a": refusing}.get,
            [5.0, 5.0],  # three tries, 5 s apart: longer than a run waits
            breakers=_fresh_breakers(),
            clock=clock.time,
            sleep=clock.sleep,
            **options,
        ).run(logged_rows(engine))

    def state() -> tuple[str, str, int, int]:
        rows = rows_by_seq(engine)
        failures = json.loads(rows[1].deliveries)["a"]["failures"]
        return rows[1].status, rows[2].status, rows[1].retry_count, failures

    run(resume_delays=True)
    assert state() == ("PENDING", "HELD", 0, 1) and rows_by_seq(engine)[3].status == "PUBLISHED"
    figures = health_report(engine, routes).targets["a"]
    assert (figures.pending, figures.held, figures.failed) == (1, 1, 0)  # a retry is no failure
    assert "a: try 1 of 3 failed, next at" in rows_by_seq(engine)[1].error_details
    assert clock.slept == []  # the run did not wait 5 s for it
    calls = len(refusing.calls)
    run(resume_delays=True)  # its pause is not over: not tried
    assert len(refusing.calls) == calls and state() == ("PENDING", "HELD", 0, 1)
    clock.now += 5
    run(resume_delays=True)
    assert state() == ("PENDING", "HELD", 1, 2)
    clock.now += 5
    run(resume_delays=True)  # the last try: FAILED, its key held
    assert state() == ("FAILED", "HELD", 2, 3)
    figures = health_report(engine, routes).targets["a"]
    assert (figures.pending, figures.held, figures.failed) == (0, 1, 1)
    clock.now += 100
    calls = len(refusing.calls)
    run(resume_delays=True)  # the relay does not try again after the last try
    assert len(refusing.calls) == calls
    run(resume_delays=False)  # a replay tries it at once, once
    assert len(refusing.calls) == calls + 1 and state() == ("FAILED", "HELD", 3, 4)
    refusing.word = "never-matches"
    run(resume_delays=False, retry_threshold=3)  # at the threshold: left as it is
    assert state()[0] == "FAILED"
    run(resume_delays=False, retry_threshold=4)
    assert [r.status for r in rows_by_seq(engine).values()] == ["PUBLISHED"] * 3


def test_a_retry_pause_does_not_hold_other_keys(engine: Engine, tmp_path: Path) -> None:
    emit_all(engine, [("A", "k", {"n": "poison"})] + [("A", "j", {"n": n}) for n in range(3)])
    clock = SteppedClock()
    refusing = Refusing("a", local_store(tmp_path, "a"), "poison")
    refusing.atomic = False  # one event per key per call
    pauses_at_call: list[int] = []
    publish = refusing.publish
    refusing.publish = lambda events: (pauses_at_call.append(len(clock.slept)), publish(events))[1]
    Publisher(
        engine,
        merge_routes({"A": ["a"]}),
        {"a": refusing}.get,
        [0.3, 0.3],
        breakers=_fresh_breakers(),
        clock=clock.time,
        sleep=clock.sleep,
    ).run(logged_rows(engine))
    sent_j = [n for n, seqs in enumerate(refusing.calls) if set(seqs) & {2, 3, 4}]
    assert all(pauses_at_call[n] == 0 for n in sent_j)  # every j event went before any pause
    assert clock.slept == [0.3, 0.3]  # then the run waited for k's retries, which are due soon
    assert rows_by_seq(engine)[1].status == "FAILED"
    assert [rows_by_seq(engine)[s].status for s in (2, 3, 4)] == ["PUBLISHED"] * 3


class ClosingMidCall(Target):
    """Fault injection: like a broker that closes the connection at the poison message, it
    confirms what came before it in the call and fails the call as a whole."""

    def __init__(self, name: str, inner: Target, word: str) -> None:
        super().__init__(name)
        self.inner, self.word = inner, word

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        cut = next((n for n, e in enumerate(events) if self.word in e.payload), len(events))
        self.inner.publish(events[:cut])
        if cut < len(events):
            confirmed = [n < cut for n in range(len(events))]
            raise TargetCallFailed("connection closed mid-call", confirmed=confirmed)
        return [None] * len(events)


def test_what_was_confirmed_before_a_call_failed_is_kept(engine: Engine, tmp_path: Path) -> None:
    emit_all(engine, [("A", f"k{k}", {"n": "poison" if k == 3 else k}) for k in range(7)])
    store = local_store(tmp_path, "a")
    target = ClosingMidCall("a", store, "poison")
    Publisher(
        engine, merge_routes({"A": ["a"]}), {"a": target}.get, [0.0], breakers=_fresh_breakers()
    ).run(logged_rows(engine))
    rows = rows_by_seq(engine)
    assert [rows[s].status for s in range(1, 8)] == ["PUBLISHED"] * 3 + ["FAILED"] + [
        "PUBLISHED"
    ] * 3
    assert stored_seqs(store, engine) == [1, 2, 3, 5, 6, 7]  # each once
    assert [r.retry_count for r in rows.values()] == [0, 0, 0, 1, 0, 0, 0]


def test_the_backoff_grows_to_its_cap_with_jitter_and_never_overflows() -> None:
    config = load_config({"relay": {"retry": {"attempts": 20}}}).relay.retry
    policy = RetryPolicy.of(config)
    assert policy.attempts == 20
    pauses = [policy.delay(n) for n in range(1, 12)]
    assert 0.16 <= pauses[0] <= 0.24 and 0.32 <= pauses[1] <= 0.48  # 200 ms, 400 ms ±20 %
    assert all(24.0 <= p <= 36.0 for p in pauses[8:])  # capped at 30 s ±20 %
    assert len({round(policy.delay(3), 6) for _ in range(20)}) > 1  # jittered
    assert RetryPolicy(attempts=5000, initial=1, multiplier=10, maximum=30).delay(4000) == 30
    explicit = RetryPolicy.of([0.01, 0.025, 0.04])
    assert (explicit.attempts, explicit.delay(1), explicit.delay(3)) == (4, 0.01, 0.04)


def test_what_is_settled_is_recorded_before_the_run_waits_for_a_retry(
    engine: Engine, tmp_path: Path
) -> None:
    """Outcomes are recorded at most every FLUSH_EVERY_S during a run, but always before it
    sleeps for a retry: meanwhile the log shows what was already delivered."""
    emit_all(engine, [("A", "j", {"n": 1}), ("A", "k", {"n": "blip"})])
    target = Refusing("a", local_store(tmp_path, "a"), "blip")
    clock = SteppedClock()
    seen: list[dict[int, str]] = []

    def sleep(seconds: float) -> None:
        seen.append({seq: row.status for seq, row in rows_by_seq(engine).items()})
        clock.sleep(seconds)

    Publisher(
        engine, merge_routes({"A": ["a"]}), {"a": target}.get, [0.01], clock=clock.time, sleep=sleep
    ).run(logged_rows(engine))

    assert seen[0] == {1: "PUBLISHED", 2: "PENDING"}
    assert {seq: row.status for seq, row in rows_by_seq(engine).items()} == {
        1: "PUBLISHED",
        2: "FAILED",
    }
