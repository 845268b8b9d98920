"""Incomplete events for an operator: find, resubmit, park, unpark, and unroutable events
re-driven after their route was added; route patterns and the default route.

The publisher runs directly (no Spark) on real SQLite files (and the API on PostgreSQL);
``Refusing`` injects the poison a real target cannot be made to refuse. The relay's own
carry-over of resubmitted events is tested end to end in ``test_incomplete_relay.py``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names
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
from tidings.db import make_engine
from tidings.errors import ConfigError, EmitError, UsageError
from tidings.events.outbox import EventStatus
from tidings.outbox.incomplete import EventFilter, IncompleteEvents
from tidings.pipeline.publishing.publisher import Publisher
from tidings.pipeline.source.queries import read_slice
from tidings.pipeline.source.slices import LogSlice
from tidings.routing.table import Routes, add_route, check_route_key, current_routes, merge_routes


def _run(engine: Engine, routes: Routes, targets: dict, *, only_open: bool = True) -> None:
    """One publishing run over the rows the relay would read (open ones, as a carry-over)."""
    rows = [r for r in logged_rows(engine) if not only_open or r.status.value != "PUBLISHED"]
    Publisher(engine, routes, targets.get, [0.0], retry_threshold=3).run(rows)


def _statuses(engine: Engine) -> dict[int, str]:
    return {seq: row.status for seq, row in rows_by_seq(engine).items()}


def test_a_parked_poison_lets_its_key_flow_and_unpark_delivers_it_once(
    engine: Engine, tmp_path: Path
) -> None:
    emit_all(
        engine,
        [
            ("A", "k", {"n": 1}),
            ("A", "k", {"n": "poison"}),
            ("A", "k", {"n": 3}),
            ("A", "other", {"n": 4}),
            ("A", "k", {"n": 5}),
        ],
    )
    store = local_store(tmp_path, "a")
    refusing = Refusing("a", store, "poison")
    routes = merge_routes({"A": ["a"]})
    for _ in range(3):  # up to the retry threshold: FAILED for good, its key held
        _run(engine, routes, {"a": refusing})
    assert _statuses(engine) == {1: "PUBLISHED", 2: "FAILED", 3: "HELD", 4: "PUBLISHED", 5: "HELD"}
    events = IncompleteEvents(engine, routes.targets_for)
    (blocking,) = events.blocking()
    assert (blocking.seq, blocking.partition_key, blocking.held) == (2, "k", 2)
    held = events.find(EventFilter(statuses=frozenset({EventStatus.HELD})))
    assert [e.seq for e in held] == [3, 5]
    assert "held behind unpublished seq 2" in (held[0].reason or "")
    (failed,) = events.find(EventFilter(statuses=frozenset({EventStatus.FAILED})))
    assert failed.targets["a"].state == "failed" and "refused 2" in (
        failed.targets["a"].error or ""
    )

    poison_id = failed.event_id
    assert events.park([poison_id, "no-such-id"], "bad payload, ticket 42") == [poison_id]
    assert events.blocking() == []
    _run(engine, routes, {"a": refusing})  # the relay's next carry-over
    assert _statuses(engine) == {1: "PUBLISHED", 2: "PARKED", 3: "PUBLISHED", 4: "PUBLISHED"} | {
        5: "PUBLISHED"
    }
    assert rows_by_seq(engine)[2].error_details == "parked: bad payload, ticket 42"
    assert stored_seqs(store, engine) == [1, 4, 3, 5]

    refusing.word = "never-matches"  # the target was fixed
    assert events.unpark([poison_id]) == 1
    row = rows_by_seq(engine)[2]
    assert (row.status, row.retry_count, row.error_details) == ("PENDING", 0, None)
    _run(engine, routes, {"a": refusing})
    _run(engine, routes, {"a": refusing})
    assert set(_statuses(engine).values()) == {"PUBLISHED"}
    assert stored_seqs(store, engine) == [1, 4, 3, 5, 2]  # once, after its key's later events
    assert events.unpark([poison_id]) == 0  # no longer parked


def test_park_and_its_refusals(engine: Engine, tmp_path: Path) -> None:
    emit_all(engine, [("A", "k", {"n": 1}), ("Nowhere", "k", {"n": 2})])
    routes = merge_routes({"A": ["a"]})
    _run(engine, routes, {"a": local_store(tmp_path, "a")})
    events = IncompleteEvents(engine, routes.targets_for)
    ids = [r.event.event_id for r in logged_rows(engine)]
    assert events.park(ids, "why not") == []  # a published and an unroutable event: not open
    with pytest.raises(UsageError, match="needs a reason"):
        events.park(ids, "  ")
    with pytest.raises(UsageError, match="at least one event id"):
        events.park([], "reason")
    with pytest.raises(UsageError, match="status must be one of"):
        EventFilter(statuses=frozenset({EventStatus.PUBLISHED}))
    with pytest.raises(UsageError, match="limit"):
        EventFilter(limit=0)


def test_a_run_in_flight_does_not_undo_a_park(engine: Engine, tmp_path: Path) -> None:
    """A relay task that read the event before it was parked fails it again: the failure
    must not overwrite the park (its key would be held again)."""
    emit_all(engine, [("A", "k", {"n": "poison"}), ("A", "k", {"n": 2})])
    refusing = Refusing("a", local_store(tmp_path, "a"), "poison")
    routes = merge_routes({"A": ["a"]})
    read_before = logged_rows(engine)
    events = IncompleteEvents(engine, routes.targets_for)
    events.park([read_before[0].event.event_id], "poison")
    Publisher(engine, routes, {"a": refusing}.get, [0.0]).run(read_before)
    assert _statuses(engine)[1] == "PARKED"


def test_resubmit_by_target_touches_only_that_target(engine: Engine, tmp_path: Path) -> None:
    emit_all(
        engine,
        [("A", "k1", {"n": "bad-for-b"}), ("A", "k2", {"n": "bad-for-c"}), ("A", "k3", {"n": 3})],
    )
    a = local_store(tmp_path, "a")
    b = Refusing("b", local_store(tmp_path, "b"), "bad-for-b")
    c = Refusing("c", local_store(tmp_path, "c"), "bad-for-c")
    targets = {"a": a, "b": b, "c": c}
    routes = merge_routes({"A": ["a", "b", "c"]})
    for _ in range(3):
        _run(engine, routes, targets)
    assert _statuses(engine) == {1: "FAILED", 2: "FAILED", 3: "PUBLISHED"}
    events = IncompleteEvents(engine, routes.targets_for)
    at_b = events.find(EventFilter(target="b"))
    assert [e.seq for e in at_b] == [1]
    assert at_b[0].targets["a"].state == "confirmed" and at_b[0].targets["b"].failures >= 1

    b.word = "never-matches"
    assert events.resubmit(EventFilter(target="b")) == 1
    states = json.loads(rows_by_seq(engine)[1].deliveries)
    assert set(states) == {"a", "c"}  # b's failure cleared, a's confirmation kept
    untouched = rows_by_seq(engine)[2]
    assert (untouched.status, untouched.retry_count) == ("FAILED", 3)
    _run(engine, routes, targets)
    assert _statuses(engine) == {1: "PUBLISHED", 2: "FAILED", 3: "PUBLISHED"}
    assert stored_seqs(a, engine) == [1, 2, 3]  # a was not sent seq 1 again
    assert stored_seqs(b.inner, engine) == [2, 3, 1]


def test_unroutable_events_are_redriven_once_in_key_order(engine: Engine, tmp_path: Path) -> None:
    emit_all(
        engine,
        [
            ("New", "k1", {"n": 1}),
            ("New", "k2", {"n": 2}),
            ("Old", "k1", {"n": 3}),
            ("New", "k1", {"n": 4}),
            ("New", "k2", {"n": 5}),
            ("Newer", "k1", {"n": 6}),
        ],
    )
    config = load_config(
        {
            "database": {"url": str(engine.url)},
            "targets": {"a": {"kind": "event_store", "url": f"sqlite:///{tmp_path / 'a.db'}"}},
            "routing": {"routes": {"Old": ["a"]}},
        }
    )
    store = local_store(tmp_path, "a")
    _run(engine, current_routes(config, engine), {"a": store})
    assert _statuses(engine) == {1: "UNROUTABLE", 2: "UNROUTABLE", 3: "PUBLISHED"} | {
        4: "UNROUTABLE",
        5: "UNROUTABLE",
        6: "UNROUTABLE",
    }
    add_route(engine, "New*", "a")  # a prefix pattern: New and Newer
    routes = current_routes(config, engine)
    events = IncompleteEvents(engine, routes.targets_for)
    assert events.resubmit(EventFilter(older_than=timedelta(0))) == 0  # FAILED only, unasked
    unroutable = EventFilter(statuses=frozenset({EventStatus.UNROUTABLE}))
    assert events.resubmit(EventFilter(statuses=unroutable.statuses, event_type="Newer")) == 1
    assert events.resubmit(unroutable) == 4
    assert events.resubmit(unroutable) == 0  # nothing is resubmitted twice
    _run(engine, routes, {"a": store})
    assert set(_statuses(engine).values()) == {"PUBLISHED"}
    delivered = stored_seqs(store, engine)
    assert sorted(delivered) == [1, 2, 3, 4, 5, 6]  # exactly once each
    keys = {1: "k1", 2: "k2", 3: "k1", 4: "k1", 5: "k2", 6: "k1"}
    for key in ("k1", "k2"):
        mine = [s for s in delivered if keys[s] == key and s != 3]
        assert mine == sorted(mine)  # re-driven in key order


def test_filters_by_type_key_age_ids_and_limit(database_url: str, tmp_path: Path) -> None:
    engine = make_engine(database_url)
    emit_all(
        engine,
        [("orders.created", "k1", {}), ("orders.paid", "k2", {}), ("users.new", "k1", {})],
    )
    events = IncompleteEvents(engine, merge_routes({}).targets_for)
    seqs = [e.seq for e in events.find()]
    assert len(seqs) == 3  # all PENDING: nothing ran yet

    def found(**where: object) -> list[int]:
        return [seqs.index(e.seq) for e in events.find(EventFilter(**where))]  # type: ignore[arg-type]

    assert found(event_type="orders.*") == [0, 1]
    assert found(event_type="orders.paid") == [1]
    assert found(partition_key="k1") == [0, 2]
    assert found(older_than=timedelta(hours=1)) == []
    assert found(older_than=timedelta(0)) == [0, 1, 2]
    assert found(limit=2) == [0, 1]
    ids = [e.event_id for e in events.find()]
    assert found(event_ids=(ids[2], ids[0])) == [0, 2]
    assert found(statuses=frozenset({EventStatus.FAILED})) == []
    assert events.count() == 3 and events.count(EventFilter(event_type="orders.*")) == 2
    assert events.count(EventFilter(partition_key="k1", limit=1)) == 1


def test_route_patterns_and_the_default_route() -> None:
    routes = merge_routes(
        {"orders.created": ["c"], "orders.*": ["o"], "*": ["all"]},
        {"orders.*": ["o", "o2"]},
        default=["dead"],
    )
    assert routes.targets_for("orders.created") == ("c", "o", "o2", "all")
    assert routes.targets_for("orders.paid") == ("o", "o2", "all")
    assert routes.targets_for("users.new") == ("all",)
    assert routes.target_names() == {"c", "o", "o2", "all", "dead"}
    only_default = merge_routes({"A": ["a"]}, default=["dead"])
    assert only_default.targets_for("B") == ("dead",)
    assert only_default.targets_for("A") == ("a",)
    assert merge_routes({"A": ["a"]}).targets_for("B") == ()
    assert check_route_key("*") == "*" and check_route_key("orders.*") == "orders.*"
    for bad in ("", " ", "**", "a*b", "?"):
        with pytest.raises(EmitError):
            check_route_key(bad)


def test_route_keys_and_default_are_validated_in_the_configuration(tmp_path: Path) -> None:
    target = {"kind": "event_store", "url": f"sqlite:///{tmp_path / 'a.db'}"}
    good = load_config(
        {"targets": {"a": target}, "routing": {"routes": {"x.*": ["a"]}, "default": ["a"]}}
    )
    assert good.routing.default == ["a"]
    with pytest.raises(ConfigError, match=r"routing.default: unknown target 'nowhere'"):
        load_config({"targets": {"a": target}, "routing": {"default": ["nowhere"]}})
    for key in ("a*b", "?", " x"):
        with pytest.raises(ConfigError, match="route key"):
            load_config({"targets": {"a": target}, "routing": {"routes": {key: ["a"]}}})


def test_a_failed_event_does_not_stop_its_key_at_its_other_targets(
    engine: Engine, tmp_path: Path
) -> None:
    """E1 fails for good at a; E2 of its key waits for a retry at b. The relay's carry-over
    must still read E2 (and E3 behind it) so that b gets them, while a keeps holding them."""
    emit_all(engine, [("T", "k", {"n": "poison"})])
    a = Refusing("a", local_store(tmp_path, "a"), "poison")
    b = Refusing("b", local_store(tmp_path, "b"), "blip")
    routes = merge_routes({"T": ["a", "b"]})
    clock = SteppedClock()

    def run(rows: list, pauses: list[float]) -> None:
        Publisher(
            engine,
            routes,
            {"a": a, "b": b}.get,
            pauses,
            clock=clock.time,
            sleep=clock.sleep,
            resume_delays=True,
        ).run(rows)

    run(logged_rows(engine), [0.01])
    emit_all(engine, [("T", "k", {"n": "blip"}), ("T", "k", {"n": 3})])
    run([r for r in logged_rows(engine) if r.event.seq > 1], [5.0])  # b refuses E2 once
    assert _statuses(engine) == {1: "FAILED", 2: "PENDING", 3: "HELD"}
    b.word, clock.now = "never-matches", clock.now + 10
    carry = LogSlice(3, 3, 0, 1, carry_upto=3, carry_limit=1000)
    carried = [item.event.seq for chunk in read_slice(engine, carry) for item in chunk]
    assert carried == [1, 2, 3]
    run([r for r in logged_rows(engine) if r.event.seq in carried], [5.0])
    assert stored_seqs(b.inner, engine) == [1, 2, 3]  # b got the key's events, in order
    assert stored_seqs(a.inner, engine) == []  # a holds them behind the poison
    assert _statuses(engine) == {1: "FAILED", 2: "HELD", 3: "HELD"}


def test_a_retry_with_no_try_left_is_settled_failed(engine: Engine, tmp_path: Path) -> None:
    """A PENDING event whose tries ran out by a lower threshold (or a route change) is
    settled FAILED, not left PENDING with a retry time in the past."""
    emit_all(engine, [("A", "k", {"n": "poison"}), ("A", "k", {"n": 2})])
    refusing = Refusing("a", local_store(tmp_path, "a"), "poison")
    routes = merge_routes({"A": ["a"]})
    clock = SteppedClock()
    options = {"clock": clock.time, "sleep": clock.sleep, "resume_delays": True}
    Publisher(engine, routes, {"a": refusing}.get, [5.0, 5.0, 5.0], **options).run(
        logged_rows(engine)
    )
    assert _statuses(engine) == {1: "PENDING", 2: "HELD"}
    clock.now += 10
    Publisher(
        engine, routes, {"a": refusing}.get, [5.0, 5.0, 5.0], retry_threshold=0, **options
    ).run(logged_rows(engine))
    assert _statuses(engine) == {1: "FAILED", 2: "HELD"}


def test_a_stale_copy_never_undoes_a_publication(engine: Engine, tmp_path: Path) -> None:
    """A replay beside the relay read the same open events; the relay delivered them, then
    the replay's copy fails: its outcome must not turn PUBLISHED back into FAILED/HELD."""
    emit_all(engine, [("A", "k", {"n": 1}), ("A", "k", {"n": 2})])
    store = Refusing("a", local_store(tmp_path, "a"), "nothing")
    routes = merge_routes({"A": ["a"]})
    stale = logged_rows(engine)
    Publisher(engine, routes, {"a": store}.get, [0.0]).run(logged_rows(engine))
    assert _statuses(engine) == {1: "PUBLISHED", 2: "PUBLISHED"}
    store.word = '"n"'  # the target now refuses both
    Publisher(engine, routes, {"a": store}.get, [0.0]).run(stale)
    assert _statuses(engine) == {1: "PUBLISHED", 2: "PUBLISHED"}
