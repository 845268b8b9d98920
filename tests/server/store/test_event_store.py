"""The embedded event store and its target, on real SQLite files and a real PostgreSQL."""

from __future__ import annotations

import logging
import random
import string
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError, OperationalError

from tidings.db import driver_url
from tidings.errors import SchemaError, StoreError, TargetCallFailed, TargetUnavailable
from tidings.events.model import EventId, NewEvent, PayloadKind, StoredEvent
from tidings.events.outbox import OutboxEvent
from tidings.events.query import QueryData
from tidings.events.validation import validate_new_event
from tidings.server.store import EventStore
from tidings.server.store.copies import copies_between
from tidings.server.store.queries import query_events
from tidings.targets.kinds.event_store import EventStoreTarget, EventStoreTargetConfig


@pytest.fixture
def store(database_url: str) -> Iterator[EventStore]:
    opened = EventStore(database_url)
    yield opened
    opened.close()


def _event(
    *type_: str,
    outbox_id: str | None = None,
    payload: bytes | None = None,
    kind: PayloadKind | None = None,
    source_us: int | None = None,
) -> NewEvent:
    return NewEvent(
        type=type_ or ("a", "b"),
        payload=payload,
        payload_kind=kind,
        source_timestamp_us=source_us,
        outbox_event_id=outbox_id,
    )


def _execute(url: str, sql: str) -> None:
    """Run raw SQL against the store's database, behind the store's back."""
    engine = create_engine(driver_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(text(sql))
    finally:
        engine.dispose()


def _assert_positions_increase(events: list[StoredEvent]) -> None:
    positions = [e.position for e in events]
    assert all(a < b for a, b in pairwise(positions)), positions


# --- ids, sessions, timestamps ------------------------------------------------------------


def test_one_register_is_one_session_with_one_timestamp(store: EventStore) -> None:
    before = time.time_ns() // 1000
    stored = store.register(
        [
            _event("x", payload=b"\x00\x01raw", kind=PayloadKind.BINARY, source_us=-5),
            _event("y", "z", payload=b'{"k": 1}', kind=PayloadKind.JSON, source_us=1_700_000),
            _event("sbs", payload=b"sbs-bytes", kind=PayloadKind.SBS),
            _event("bare"),
        ]
    )
    after = time.time_ns() // 1000

    assert [e.id for e in stored] == [EventId(1, 1, i) for i in (1, 2, 3, 4)]
    assert len({e.timestamp_us for e in stored}) == 1
    assert before <= stored[0].timestamp_us <= after
    _assert_positions_increase(stored)
    assert [e.type for e in stored] == [("x",), ("y", "z"), ("sbs",), ("bare",)]
    assert [e.payload_kind for e in stored] == [
        PayloadKind.BINARY,
        PayloadKind.JSON,
        PayloadKind.SBS,
        None,
    ]
    assert [e.source_timestamp_us for e in stored] == [-5, 1_700_000, None, None]
    assert store.read() == stored


def test_sessions_and_positions_increase_across_registers(store: EventStore) -> None:
    assert store.last_event_id() == EventId(1, 0, 0)
    assert store.count() == 0

    sessions = [store.register([_event() for _ in range(size)]) for size in (2, 1, 3)]

    assert [[e.id for e in s] for s in sessions] == [
        [EventId(1, 1, 1), EventId(1, 1, 2)],
        [EventId(1, 2, 3)],
        [EventId(1, 3, 4), EventId(1, 3, 5), EventId(1, 3, 6)],
    ]
    everything = [e for s in sessions for e in s]
    _assert_positions_increase(everything)
    assert store.read() == everything
    assert store.last_event_id() == EventId(1, 3, 6)
    assert store.count() == 6
    assert store.register([]) == []
    assert store.last_event_id() == EventId(1, 3, 6)


def test_servers_number_their_sessions_independently(database_url: str) -> None:
    one, two = EventStore(database_url, server_id=1), EventStore(database_url, server_id=2)
    try:
        first = one.register([_event()])
        second = two.register([_event(), _event()])
        third = one.register([_event()])
        assert [e.id for e in first + second + third] == [
            EventId(1, 1, 1),
            EventId(2, 1, 1),
            EventId(2, 1, 2),
            EventId(1, 2, 2),
        ]
        _assert_positions_increase(first + second + third)
        assert one.last_event_id(server_id=2) == EventId(2, 1, 2)
        assert two.last_event_id() == EventId(2, 1, 2)
        assert one.last_event_id(server_id=9) == EventId(9, 0, 0)
    finally:
        one.close()
        two.close()


def test_types_keep_any_characters(database_url: str) -> None:
    odd = ("a,b", '"q"', "[x]", "ü€😀", "\x00nul", "\ud800", "", " ", "\\", "?x", "a*")
    store = EventStore(database_url)
    store.register([_event(*odd)])
    store.close()

    reopened = EventStore(database_url)
    try:
        assert reopened.read()[0].type == odd
    finally:
        reopened.close()


# --- dedup ----------------------------------------------------------------------------------


def test_dedup_across_calls_returns_the_stored_event(store: EventStore) -> None:
    first = store.register([_event(outbox_id="A"), _event(outbox_id="B")])
    again = store.register(
        [_event(outbox_id="B", payload=b"x", kind=PayloadKind.BINARY), _event(outbox_id="C")]
    )

    assert again[0] == first[1]
    assert again[1].id == EventId(1, 2, 3)
    assert again[1].position > first[1].position
    assert store.count() == 3
    assert again[0].payload is None
    assert store.by_outbox_ids(["A", "B", "C", "unknown"]) == {
        "A": [first[0]],
        "B": [first[1]],
        "C": [again[1]],
    }
    with pytest.raises(StoreError, match="not one str"):
        store.by_outbox_ids("A")


def test_dedup_within_one_call_stores_once(store: EventStore) -> None:
    stored = store.register(
        [
            _event(outbox_id="A"),
            _event(outbox_id="A", payload=b"dup", kind=PayloadKind.BINARY),
            _event(outbox_id="B"),
            _event(),
        ]
    )

    assert stored[0] == stored[1]
    assert stored[1].payload is None
    assert [e.id.instance for e in (stored[0], stored[2], stored[3])] == [1, 2, 3]
    assert store.count() == 3


def test_a_call_of_only_duplicates_uses_no_session(store: EventStore) -> None:
    (first,) = store.register([_event(outbox_id="A")])

    assert store.register([_event(outbox_id="A"), _event(outbox_id="A")]) == [first, first]
    assert store.register([_event(outbox_id="B")])[0].id == EventId(1, 2, 2)
    assert store.count() == 2


def test_dedup_and_lookup_span_many_in_chunks(store: EventStore) -> None:
    ids = [f"id-{i:05d}" for i in range(1200)]
    stored = store.register([_event(outbox_id=i) for i in ids])

    assert store.by_outbox_ids([*ids, "nope"]) == {i: [e] for i, e in zip(ids, stored, strict=True)}
    again = store.register([_event(outbox_id=i) for i in [*ids, "new"]])
    assert again[:1200] == stored
    assert again[1200].id == EventId(1, 2, 1201)
    assert store.count() == 1201


def test_one_outbox_id_under_two_types_is_stored_once_per_type(store: EventStore) -> None:
    """One outbox event routed to two targets on one store with different type prefixes."""
    orders, audit = ("orders", "OrderPlaced"), ("audit", "OrderPlaced")
    first = store.register([_event(*orders, outbox_id="A"), _event(*audit, outbox_id="A")])

    assert [e.type for e in first] == [orders, audit]
    assert [e.id for e in first] == [EventId(1, 1, 1), EventId(1, 1, 2)]
    assert store.count() == 2
    assert store.by_outbox_ids(["A"]) == {"A": first}

    # Re-published, one type per call as two targets would, or both at once: nothing new.
    assert store.register([_event(*audit, outbox_id="A")]) == [first[1]]
    assert store.register([_event(*orders, outbox_id="A")]) == [first[0]]
    assert store.register([_event(*audit, outbox_id="A"), _event(*orders, outbox_id="A")]) == [
        first[1],
        first[0],
    ]
    assert store.count() == 2
    assert store.last_event_id() == EventId(1, 1, 2)

    # A third type of the same outbox id is new, and listed after the others.
    (third,) = store.register([_event("more", outbox_id="A")])
    assert third.id == EventId(1, 2, 3)
    assert store.by_outbox_ids(["A"]) == {"A": [*first, third]}


def test_the_same_id_and_type_twice_in_one_call_is_stored_once(store: EventStore) -> None:
    stored = store.register(
        [
            _event("orders", outbox_id="A"),
            _event("audit", outbox_id="A"),
            _event("orders", outbox_id="A", payload=b"dup", kind=PayloadKind.BINARY),
            _event("audit", outbox_id="A"),
        ]
    )

    assert stored[2] == stored[0]
    assert stored[3] == stored[1]
    assert stored[0] != stored[1]
    assert stored[2].payload is None
    assert [e.id.instance for e in stored] == [1, 2, 1, 2]
    assert store.count() == 2
    assert store.by_outbox_ids(["A"]) == {"A": stored[:2]}


def test_the_database_enforces_one_event_per_outbox_id_and_type(database_url: str) -> None:
    EventStore(database_url).close()
    # A unique index of the events that have an outbox id (partial: the others, most of
    # them, cost it nothing).
    definition = _indexes(database_url)["event_events_outbox_key"]
    assert "UNIQUE" in definition.upper()
    assert "(outbox_event_id, type)" in definition
    assert "WHERE" in definition.upper() and "outbox_event_id IS NOT NULL" in definition

    row = (
        "INSERT INTO event_events (position, server, session, instance, type, timestamp_us,"
        " outbox_event_id) VALUES ({}, 99, {}, 1, '{}', 0, 'A')"
    )
    _execute(database_url, row.format(1, 1, '["x"]'))
    _execute(database_url, row.format(2, 2, '["y"]'))
    # PostgreSQL names the constraint, SQLite its columns.
    duplicate = r"event_events_outbox_key|event_events\.outbox_event_id, event_events\.type"
    with pytest.raises(IntegrityError, match=duplicate):
        _execute(database_url, row.format(3, 3, '["x"]'))


def test_lookup_lists_every_type_of_ids_spread_over_chunks(store: EventStore) -> None:
    ids = [f"id-{i:05d}" for i in range(700)]
    first = store.register([_event("one", outbox_id=i) for i in ids])
    second = store.register([_event("two", outbox_id=i) for i in reversed(ids)])

    found = store.by_outbox_ids(ids)
    assert found == {i: [a, b] for i, a, b in zip(ids, first, reversed(second), strict=True)}
    again = store.register([_event(t, outbox_id=i) for i in ids for t in ("two", "one")])
    assert again == [e for a, b in zip(first, reversed(second), strict=True) for e in (b, a)]
    assert store.count() == 1400


# --- validation and atomicity --------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (NewEvent(type=()), "non-empty tuple"),
        (NewEvent(type=("a", "?")), "reserved as a query wildcard"),
        (NewEvent(type=("*",)), "reserved as a query wildcard"),
        (NewEvent(type=("a", 1)), "non-str segment"),  # type: ignore[arg-type]
        (NewEvent(type=["a"]), "non-empty tuple"),  # type: ignore[arg-type]
        (NewEvent(type=("a",), payload=b"x"), "given together"),
        (NewEvent(type=("a",), payload_kind=PayloadKind.JSON), "given together"),
        (NewEvent(type=("a",), payload="x", payload_kind=PayloadKind.JSON), "must be bytes"),  # type: ignore[arg-type]
        (NewEvent(type=("a",), payload=b"x", payload_kind="json"), "PayloadKind"),  # type: ignore[arg-type]
        (NewEvent(type=("a",), source_timestamp_us=1.5), "must be an int"),  # type: ignore[arg-type]
        (NewEvent(type=("a",), source_timestamp_us=2**63), "between"),
        (NewEvent(type=("a",), outbox_event_id=""), "non-empty str"),
        (NewEvent(type=("a",), outbox_event_id="a\x00b"), "NUL"),
        (NewEvent(type=("a",), outbox_event_id="\ud800"), "lone surrogate"),
    ],
)
def test_an_invalid_event_rejects_the_whole_batch(
    store: EventStore, bad: NewEvent, message: str
) -> None:
    store.register([_event()])

    with pytest.raises(StoreError, match=message) as raised:
        store.register([_event(outbox_id="good"), bad, _event()])

    assert "event 1" in str(raised.value)
    assert store.count() == 1
    assert store.by_outbox_ids(["good"]) == {}
    assert store.register([_event()])[0].id == EventId(1, 2, 2)


def test_validate_new_event_names_the_problem_without_an_index() -> None:
    assert validate_new_event(_event(outbox_id="A", payload=b"x", kind=PayloadKind.SBS)) is None
    assert validate_new_event(NewEvent(type=("a", "?"))) == (
        "type ('a', '?') has segment '?', which is reserved as a query wildcard"
    )
    assert validate_new_event(NewEvent(type=("a",), outbox_event_id="")) == (
        "outbox_event_id must be a non-empty str, not ''"
    )
    assert validate_new_event(("a",)) == "expected a NewEvent, got tuple"


def test_a_type_once_accepted_does_not_spare_the_rest_of_an_event_its_checks() -> None:
    """Types are checked once (remembered); every other field of each event still is, with
    the messages an event of a new type gets."""
    kinds = ("c", "checked")
    assert validate_new_event(_event(*kinds, payload=b"x", kind=PayloadKind.JSON)) is None
    for _ in range(2):  # the first time the type is new, then remembered
        assert validate_new_event(_event(*kinds, payload=b"x")) == (
            "payload and payload_kind must be given together"
        )
        assert validate_new_event(_event(*kinds, outbox_id="")) == (
            "outbox_event_id must be a non-empty str, not ''"
        )
        assert validate_new_event(_event(*kinds, outbox_id="o" * 501)) == (
            f"outbox_event_id {'o' * 40!r}... is over 500 bytes"
        )
        assert validate_new_event(NewEvent(type=kinds, source_timestamp_us=2**63)) == (
            f"source_timestamp_us must be between {-(2**63)} and {2**63 - 1}, not {2**63}"
        )
        assert validate_new_event(NewEvent(type=(*kinds, "*"))) is not None
        assert validate_new_event(NewEvent(type=(*kinds, "x" * 2_000))) is not None
        assert validate_new_event(NewEvent(type=(kinds[0], ["unhashable"]))) is not None  # type: ignore[arg-type]


def test_a_database_failure_mid_insert_rolls_everything_back(
    store: EventStore, database_url: str
) -> None:
    store.register([_event()])
    # A row planted behind the store's back collides with the 6th position of the next call.
    _execute(
        database_url,
        "INSERT INTO event_events (position, server, session, instance, type, timestamp_us)"
        " VALUES (7, 99, 1, 1, '[\"planted\"]', 0)",
    )

    with pytest.raises(StoreError, match="cannot register"):
        store.register([_event(outbox_id=f"o{i}") for i in range(10)])

    assert store.count() == 2
    assert store.by_outbox_ids([f"o{i}" for i in range(10)]) == {}
    _execute(database_url, "DELETE FROM event_events WHERE server = 99")
    retried = store.register([_event(outbox_id=f"o{i}") for i in range(10)])
    assert retried[0].id == EventId(1, 2, 2)
    assert retried[0].position == 2


# --- durability and reading ----------------------------------------------------------------


def test_events_and_counters_survive_reopening(database_url: str) -> None:
    store = EventStore(database_url)
    first = store.register([_event(outbox_id="A"), _event()])
    store.close()

    reopened = EventStore(database_url)
    try:
        assert reopened.read() == first
        assert reopened.last_event_id() == EventId(1, 1, 2)
        assert reopened.register([_event(outbox_id="A")]) == [first[0]]
        (later,) = reopened.register([_event()])
        assert later.id == EventId(1, 2, 3)
        assert later.position > first[-1].position
    finally:
        reopened.close()


def test_a_schema_of_another_version_is_refused(database_url: str) -> None:
    EventStore(database_url).close()
    _execute(database_url, "UPDATE event_store_meta SET value = '999' WHERE key = 'schema_version'")

    with pytest.raises(SchemaError, match="schema version '999'"):
        EventStore(database_url)


def test_read_pages_in_position_order(store: EventStore) -> None:
    stored = [e for size in (10, 7, 8) for e in store.register([_event() for _ in range(size)])]

    pages: list[list[StoredEvent]] = []
    after = 0
    while page := store.read(after_position=after, limit=10):
        pages.append(page)
        after = page[-1].position

    assert [len(p) for p in pages] == [10, 10, 5]
    assert [e for p in pages for e in p] == stored
    assert store.read(after_position=stored[-1].position) == []
    assert store.read(after_position=stored[3].position, limit=2) == stored[4:6]


@pytest.mark.parametrize(("after", "limit"), [(-1, 10), (0, 0), (0, "10")])
def test_read_refuses_bad_arguments(store: EventStore, after: int, limit: int) -> None:
    with pytest.raises(StoreError):
        store.read(after_position=after, limit=limit)


def test_a_closed_store_refuses_work(store: EventStore) -> None:
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.register([_event()])


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u@h/db", "unsupported database"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
        ("not a url", "invalid database url"),
    ],
)
def test_unusable_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        EventStore(url)


def test_a_missing_directory_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot create schema"):
        EventStore(f"sqlite:///{tmp_path / 'missing' / 'events.db'}")


# --- concurrency ---------------------------------------------------------------------------


def test_concurrent_registers_lose_nothing_and_stay_in_order(store: EventStore) -> None:
    writers, calls, size = 4, 15, 40
    errors: list[BaseException] = []
    done = threading.Event()
    followed: list[StoredEvent] = []

    def write(writer: int) -> None:
        try:
            for call in range(calls):
                store.register([_event(outbox_id=f"{writer}-{call}-{i}") for i in range(size)])
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    def follow() -> None:
        """Reads as a stream consumer does: a position once passed is never looked at again."""
        after = 0
        while True:
            finished = done.is_set()  # read before the last page, so that page is complete
            page = store.read(after_position=after)
            followed.extend(page)
            if page:
                after = page[-1].position
            elif finished:
                return
            else:
                time.sleep(0.001)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    follower = threading.Thread(target=follow)
    follower.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    follower.join()

    assert errors == []
    everything = store.read(limit=10_000)
    assert len(everything) == writers * calls * size == store.count()
    _assert_positions_increase(everything)
    assert followed == everything
    sessions = {e.id.session for e in everything}
    assert sessions == set(range(1, writers * calls + 1))
    # One instance counter over all sessions (hat-event 0.8.5): in position order, every
    # number once, each session a contiguous run.
    assert [e.id for e in everything] == sorted(e.id for e in everything)
    assert [e.id.instance for e in everything] == list(range(1, len(everything) + 1))


def test_concurrent_registers_of_the_same_outbox_ids_store_each_once(store: EventStore) -> None:
    """The relay may re-publish a batch while the first attempt is still being stored."""
    ids = [f"same-{i}" for i in range(50)]
    results: list[list[StoredEvent]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def write() -> None:
        start.wait()
        try:
            results.append(store.register([_event(outbox_id=i) for i in ids]))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert store.count() == len(ids)
    assert all(result == results[0] for result in results)
    assert store.last_event_id() == EventId(1, 1, len(ids))


# --- instance numbering (hat-event 0.8.5) ----------------------------------------------------


def test_instance_counter_is_seeded_from_the_events_and_never_reused(database_url: str) -> None:
    store = EventStore(database_url)
    store.register([_event(), _event(), _event()])
    store.register([_event(outbox_id="last")])
    store.close()
    # Retention deleted the newest events; a lost counter row is re-seeded from the events.
    _execute(database_url, "DELETE FROM event_events WHERE instance >= 3")
    reopened = EventStore(database_url)
    try:
        (after_retention,) = reopened.register([_event()])
        assert after_retention.id == EventId(1, 3, 5)
    finally:
        reopened.close()

    _execute(database_url, "DELETE FROM event_counters WHERE name IN ('instance:1', 'session:1')")
    reseeded = EventStore(database_url)
    try:
        assert reseeded.register([_event(), _event()])[0].id == EventId(1, 4, 6)
    finally:
        reseeded.close()


# --- events synced from other servers ------------------------------------------------------


def _synced(
    server: int,
    session: int,
    instance: int,
    *type_: str,
    timestamp_us: int = 1_000,
    outbox_id: str | None = None,
    source_us: int | None = None,
    payload: bytes | None = None,
) -> StoredEvent:
    """An event as a peer server sent it; its position is the peer's, which is ignored."""
    return StoredEvent(
        position=999_999,
        id=EventId(server, session, instance),
        type=type_ or ("peer", str(server)),
        timestamp_us=timestamp_us,
        source_timestamp_us=source_us,
        payload=payload,
        payload_kind=None if payload is None else PayloadKind.JSON,
        outbox_event_id=outbox_id,
    )


def test_synced_events_keep_their_ids_and_get_local_positions(store: EventStore) -> None:
    (local,) = store.register([_event("local")])
    sent = [
        _synced(2, 7, 40, "x", timestamp_us=-5, source_us=3, payload=b'"p"', outbox_id="o1"),
        _synced(2, 7, 41, "y", timestamp_us=-5),
        _synced(3, 1, 1, timestamp_us=2**62),
    ]

    stored = store.append_synced(sent)

    positions = [e.position for e in stored]
    assert positions == list(range(local.position + 1, local.position + 4))
    assert stored == [replace(e, position=p) for e, p in zip(sent, positions, strict=True)]
    assert store.read() == [local, *stored]
    assert store.last_event_id(2) == EventId(2, 7, 41)
    assert store.last_event_id(3) == EventId(3, 1, 1)
    assert store.by_outbox_ids(["o1"]) == {"o1": [stored[0]]}
    # This server's numbering is untouched by other servers' ids.
    assert store.register([_event()])[0].id == EventId(1, 2, 2)


def test_synced_events_are_idempotent(store: EventStore) -> None:
    first = store.append_synced([_synced(2, 1, 1), _synced(2, 1, 2)])

    assert store.append_synced([_synced(2, 1, 1), _synced(2, 1, 2)]) == []
    # An overlapping batch stores only what is new, in input order; a repeated id once.
    again = store.append_synced(
        [_synced(2, 2, 4), _synced(2, 1, 2), _synced(2, 2, 3), _synced(2, 2, 4, "other")]
    )
    assert [e.id for e in again] == [EventId(2, 2, 4), EventId(2, 2, 3)]
    assert [e.position for e in again] == [first[-1].position + 1, first[-1].position + 2]
    assert again[0].type == ("peer", "2")
    assert store.count() == 4
    assert store.append_synced([]) == []


def test_our_own_events_sent_back_advance_our_counters(database_url: str) -> None:
    """A peer restored from a backup sends this server's events back to it."""
    one, two = EventStore(database_url, server_id=1), EventStore(database_url, server_id=2)
    try:
        one.register([_event()])
        two.register([_event()])
        stored = one.append_synced(
            [_synced(1, 5, 40), _synced(2, 3, 9), _synced(1, 4, 44), _synced(7, 1, 1)]
        )
        assert len(stored) == 4
        # Past the highest session and the highest instance, even of different events.
        assert one.register([_event()])[0].id == EventId(1, 6, 45)
        # Another server's counters in this database move too.
        assert two.register([_event()])[0].id == EventId(2, 4, 10)
        # An older event of ours arriving late moves nothing back.
        one.append_synced([_synced(1, 2, 2)])
        assert one.register([_event()])[0].id == EventId(1, 7, 46)
    finally:
        one.close()
        two.close()
    # A server with no counters yet seeds them from the synced events when it opens.
    seven = EventStore(database_url, server_id=7)
    try:
        assert seven.register([_event()])[0].id == EventId(7, 2, 2)
    finally:
        seven.close()


def test_a_synced_event_colliding_on_the_outbox_key_is_skipped_with_a_warning(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The relay stored one outbox event on two servers, each under its own id."""
    (local,) = store.register([_event("orders", outbox_id="A")])

    with caplog.at_level(logging.WARNING, logger="tidings.server.store"):
        stored = store.append_synced(
            [
                _synced(2, 1, 1, "orders", outbox_id="A"),  # collides with the local one
                _synced(2, 1, 2, "audit", outbox_id="A"),  # another type: a new event
                _synced(2, 1, 3, "audit", outbox_id="A"),  # collides within the batch
                _synced(2, 1, 4),
            ]
        )

    assert [e.id for e in stored] == [EventId(2, 1, 2), EventId(2, 1, 4)]
    assert store.by_outbox_ids(["A"]) == {"A": [local, stored[0]]}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "EventId(server=2, session=1, instance=1)" in warnings[0]
    assert "EventId(server=1, session=1, instance=1)" in warnings[0]
    assert "EventId(server=2, session=1, instance=2)" in warnings[1]


def test_a_skipped_copy_is_recorded_as_another_id_of_the_event_held(store: EventStore) -> None:
    """Whose copy names which held event: a stored one, or one stored earlier in the batch;
    recorded once however often it comes, and forgotten with its event."""
    (local,) = store.register([_event("orders", outbox_id="A")])
    batch = [
        _synced(2, 1, 1, "orders", outbox_id="A"),  # a copy of the local event
        _synced(2, 1, 2, "audit", outbox_id="A"),  # stored
        _synced(3, 1, 1, "audit", outbox_id="A"),  # a copy of the one just above
    ]
    [audit] = store.append_synced(batch)
    assert store.append_synced(batch) == []  # sent again: nothing new, no error

    def copies() -> dict[int, list[EventId]]:
        with store.transaction("read the copies") as conn:
            return copies_between(conn, 0, audit.position)

    assert copies() == {local.position: [EventId(2, 1, 1)], audit.position: [EventId(3, 1, 1)]}
    assert store.delete_positions([local.position]) == 1
    assert copies() == {audit.position: [EventId(3, 1, 1)]}


def test_a_synced_event_postgresql_cannot_index_is_skipped_with_an_error(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer (a hat-event server, a SQLite tidings) may hold a type too long for an index
    entry of PostgreSQL: such a store skips it, saying so, and keeps the rest of the batch
    (the insert failed the batch, and the Syncer client failed again at the same event on
    every reconnect: its sync stopped for good). SQLite stores it as the peer has it."""
    random_segment = "".join(random.Random(7).choices(string.ascii_letters, k=3_000))
    batch = [_synced(2, 1, 1), _synced(2, 1, 2, "t", random_segment), _synced(2, 1, 3)]

    with caplog.at_level(logging.ERROR, logger="tidings.server.store"):
        stored = store.append_synced(batch)

    if store.backend == "postgresql":
        assert [e.id for e in stored] == [EventId(2, 1, 1), EventId(2, 1, 3)]
        [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert "synced event EventId(server=2, session=1, instance=2) skipped" in error
        assert "is too long: over 2000 characters as stored" in error
    else:
        assert [e.id for e in stored] == [e.id for e in batch]
        assert stored[1].type == ("t", random_segment)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (_event(), "expected a StoredEvent"),
        (replace(_synced(2, 1, 1), id=(2, 1, 1)), "id must be an EventId"),  # type: ignore[arg-type]
        (_synced(0, 1, 1), "id.server must be between 1"),
        (_synced(2, 0, 1), "id.session must be between 1"),
        (_synced(2, 1, 0), "id.instance must be between 1"),
        (_synced(2, 1, 1, timestamp_us=2**63), "timestamp_us must be between"),
        (_synced(2, 1, 1, "a", "*"), "reserved as a query wildcard"),
        (replace(_synced(2, 1, 1), payload=b"x"), "given together"),
        (_synced(2, 1, 1, outbox_id=""), "non-empty str"),
    ],
)
def test_an_invalid_synced_event_rejects_the_whole_batch(
    store: EventStore, bad: object, message: str
) -> None:
    with pytest.raises(StoreError, match=message) as raised:
        store.append_synced([_synced(2, 1, 5), bad])  # type: ignore[list-item]

    assert "synced event 1: " in str(raised.value)
    assert store.count() == 0


def test_synced_events_and_registers_interleave_safely(store: EventStore) -> None:
    """Both take the append lock: positions stay gapless and every id is stored once."""
    errors: list[BaseException] = []

    def register() -> None:
        try:
            for _ in range(30):
                store.register([_event() for _ in range(5)])
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    def sync(server: int) -> None:
        try:
            for session in range(1, 31):
                batch = [_synced(server, session, 5 * session + i) for i in range(5)]
                store.append_synced(batch)
                store.append_synced(batch[2:])  # a re-send
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=register)]
    threads += [threading.Thread(target=sync, args=(server,)) for server in (2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    everything = store.read(limit=10_000)
    assert [e.position for e in everything] == list(range(1, 3 * 150 + 1))
    assert len({e.id for e in everything}) == 450


# --- a syncer's backlog ---------------------------------------------------------------------


def test_events_after_gives_one_servers_events_in_id_order(store: EventStore) -> None:
    store.register([_event(), _event()])  # (1,1,1), (1,1,2)
    # Out of id order on purpose: the backlog follows ids, not positions.
    store.append_synced([_synced(2, 2, 3), _synced(2, 1, 2), _synced(2, 1, 1), _synced(2, 3, 4)])
    store.register([_event()])  # (1,2,3)

    def ids(last: EventId, limit: int = 1000) -> list[tuple[int, int, int]]:
        return [(e.id.server, e.id.session, e.id.instance) for e in store.events_after(last, limit)]

    assert ids(EventId(2, 0, 0)) == [(2, 1, 1), (2, 1, 2), (2, 2, 3), (2, 3, 4)]
    assert ids(EventId(2, 1, 1)) == [(2, 1, 2), (2, 2, 3), (2, 3, 4)]
    assert ids(EventId(2, 1, 2)) == [(2, 2, 3), (2, 3, 4)]
    assert ids(EventId(2, 2, 0)) == [(2, 2, 3), (2, 3, 4)]
    assert ids(EventId(2, 0, 0), limit=2) == [(2, 1, 1), (2, 1, 2)]
    assert ids(EventId(2, 3, 4)) == []
    assert ids(EventId(1, 1, 1)) == [(1, 1, 2), (1, 2, 3)]
    assert ids(EventId(9, 0, 0)) == []
    assert store.events_after(EventId(2, 1, 1), 1) == [
        e for e in store.read() if e.id == EventId(2, 1, 2)
    ]


@pytest.mark.parametrize(
    ("last", "limit", "message"),
    [
        ((2, 0, 0), 10, "must be an EventId"),
        (EventId(0, 0, 0), 10, "last.server"),
        (EventId(2, -1, 0), 10, "last.session"),
        (EventId(2, 0, -1), 10, "last.instance"),
        (EventId(2, 0, 0), 0, "limit"),
    ],
)
def test_events_after_refuses_bad_arguments(
    store: EventStore, last: object, limit: int, message: str
) -> None:
    with pytest.raises(StoreError, match=message):
        store.events_after(last, limit)  # type: ignore[arg-type]


# --- schema upgrade -------------------------------------------------------------------------

#: The events table of schema versions 1 and 2 as tidings created it (the outbox key a
#: UNIQUE constraint), with each dialect's spellings.
_V1_EVENTS = """
CREATE TABLE event_store_meta (
    "key" VARCHAR(64) NOT NULL, value VARCHAR(256) NOT NULL, PRIMARY KEY ("key"));
CREATE TABLE event_counters (
    name VARCHAR(64) NOT NULL, value BIGINT NOT NULL, PRIMARY KEY (name));
CREATE TABLE event_events (
    position {position} NOT NULL, server BIGINT NOT NULL, session BIGINT NOT NULL,
    instance BIGINT NOT NULL, type {type} NOT NULL, timestamp_us BIGINT NOT NULL,
    source_timestamp_us BIGINT, payload {blob}, payload_kind VARCHAR(8), outbox_event_id TEXT,
    PRIMARY KEY (position),
    CONSTRAINT event_events_id_check CHECK (session > 0 AND instance > 0),
    CONSTRAINT event_events_payload_kind_check CHECK (payload_kind IN ('binary', 'json', 'sbs')),
    CONSTRAINT event_events_payload_check CHECK ((payload IS NULL) = (payload_kind IS NULL)),
    CONSTRAINT event_events_id_key UNIQUE (server, session, instance),
    CONSTRAINT event_events_outbox_key UNIQUE (outbox_event_id, type));
CREATE INDEX event_events_source_timestamp_idx
    ON event_events (source_timestamp_us, server, session, instance);
CREATE INDEX event_events_timestamp_idx ON event_events (timestamp_us, server, session, instance);
INSERT INTO event_counters (name, value) VALUES ('position', 5), ('session:1', 2), ('session:2', 1);
INSERT INTO event_events (position, server, session, instance, type, timestamp_us,
    source_timestamp_us, outbox_event_id) VALUES
    (1, 1, 1, 1, '["a"]', 100, NULL, 'o1'),
    (2, 1, 1, 2, '["b","c"]', 100, 7, NULL),
    (3, 2, 1, 1, '["q\\"\\u00fc"]', 150, NULL, NULL),
    (4, 1, 2, 1, '["a"]', 200, NULL, NULL),
    (5, 1, 2, 2, '["a"]', 200, 3, NULL)
"""
#: What version 1 had besides.
_V1_SCHEMA = (
    _V1_EVENTS
    + """;
CREATE INDEX event_events_type_idx ON event_events (type, timestamp_us);
INSERT INTO event_store_meta ("key", value) VALUES ('schema_version', '1')
"""
)
#: What version 2 had besides: the per-type indexes and the table of stored types.
_V2_SCHEMA = (
    _V1_EVENTS
    + """;
CREATE INDEX event_events_type_time_idx
    ON event_events (type, timestamp_us, server, session, instance);
CREATE INDEX event_events_type_source_idx
    ON event_events (type, source_timestamp_us, server, session, instance);
CREATE TABLE event_types (type {type} NOT NULL, PRIMARY KEY (type)) {without_rowid};
INSERT INTO event_types (type) VALUES ('["a"]'), ('["b","c"]'), ('["q\\"\\u00fc"]');
INSERT INTO event_store_meta ("key", value) VALUES ('schema_version', '2')
"""
)


def _create_old_schema(database_url: str, schema: str) -> None:
    postgresql = database_url.startswith("postgresql")
    formatted = schema.format(
        position="BIGINT" if postgresql else "INTEGER",
        type='TEXT COLLATE "C"' if postgresql else "TEXT",
        blob="BYTEA" if postgresql else "BLOB",
        without_rowid="" if postgresql else "WITHOUT ROWID",
    )
    for statement in formatted.split(";"):
        _execute(database_url, statement)


@pytest.mark.parametrize("old", [_V1_SCHEMA, _V2_SCHEMA], ids=["v1", "v2"])
def test_an_older_database_is_upgraded_in_place(database_url: str, old: str) -> None:
    _create_old_schema(database_url, old)

    store = EventStore(database_url)
    try:
        assert _scalars(database_url, "SELECT value FROM event_store_meta") == ["3"]
        assert _scalars(database_url, "SELECT type FROM event_types ORDER BY type") == [
            '["a"]',
            '["b","c"]',
            '["q\\"\\u00fc"]',
        ]
        assert [e.position for e in store.read()] == [1, 2, 3, 4, 5]
        assert store.read()[2].type == ('q"ü',)
        latest = query_events(store, QueryData(unique_type=True))
        assert [e.id for e in latest] == [EventId(1, 2, 2), EventId(2, 1, 1), EventId(1, 1, 2)]
        # Instances continue after the greatest stored one (v1 restarted them per session).
        assert store.register([_event("a")])[0].id == EventId(1, 3, 3)
        # The outbox key still holds: the event of o1 is found, not stored twice.
        assert store.register([_event("a", outbox_id="o1")])[0].position == 1
    finally:
        store.close()
    with pytest.raises(IntegrityError):  # and the database itself refuses a second one
        _execute(
            database_url,
            "INSERT INTO event_events (position, server, session, instance, type, timestamp_us,"
            " outbox_event_id) VALUES (99, 9, 9, 9, '[\"a\"]', 1, 'o1')",
        )

    indexes = _indexes(database_url)
    assert "event_events_type_idx" not in indexes
    assert {"event_events_type_time_idx", "event_events_type_source_idx"} <= set(indexes)
    assert "WHERE" in indexes["event_events_outbox_key"].upper()  # partial: outbox ids only

    # Opening again finds version 3 and changes nothing; the other server continues too.
    again = EventStore(database_url, server_id=2)
    try:
        assert again.register([_event()])[0].id == EventId(2, 2, 2)
        assert again.count() == 7
    finally:
        again.close()


#: What a user may have added to a version 2 store: tables referring to its events (one
#: cascading deletes to its rows, one refusing them), a view, an index of their own.
_USERS_OBJECTS = """
CREATE TABLE my_notes (
    id INTEGER PRIMARY KEY, pos BIGINT REFERENCES event_events (position) ON DELETE CASCADE);
CREATE TABLE my_marks (id INTEGER PRIMARY KEY, pos BIGINT REFERENCES event_events (position));
INSERT INTO my_notes (id, pos) VALUES (1, 1), (2, 4);
INSERT INTO my_marks (id, pos) VALUES (1, 2);
CREATE VIEW my_view AS SELECT position, type FROM event_events;
CREATE INDEX my_server_idx ON event_events (server)
"""


def test_an_upgrade_keeps_the_users_own_objects_that_refer_to_the_events(
    database_url: str,
) -> None:
    """SQLite rebuilds the events table in the upgrade to version 3: rows of tables that
    refer to it are neither deleted (cascade) nor refused, and views, indexes and triggers
    on it keep working (renaming the old table away rewrote them to its name and dropped
    them with it, and the store's foreign keys deleted or refused the rows)."""
    sqlite = database_url.startswith("sqlite")
    _create_old_schema(database_url, _V2_SCHEMA + ";" + _USERS_OBJECTS)
    if sqlite:  # a row of theirs already dangling (their connections did not enforce keys)
        _execute(database_url, "INSERT INTO my_marks (id, pos) VALUES (2, 999)")
        _execute(database_url, "CREATE TABLE my_log (position BIGINT)")
        _execute(
            database_url,
            "CREATE TRIGGER my_trigger AFTER INSERT ON event_events "
            "BEGIN INSERT INTO my_log VALUES (new.position); END",
        )

    store = EventStore(database_url)
    try:
        assert _scalars(database_url, "SELECT value FROM event_store_meta") == ["3"]
        stored = store.register([_event("a")])[0]
        assert stored is not None
    finally:
        store.close()
    assert _scalars(database_url, "SELECT pos FROM my_notes ORDER BY id") == [1, 4]
    marks = [2, 999] if sqlite else [2]
    assert _scalars(database_url, "SELECT pos FROM my_marks ORDER BY id") == marks
    assert _scalars(database_url, "SELECT count(*) FROM my_view") == [6]
    assert "my_server_idx" in _indexes(database_url)
    if sqlite:
        assert _scalars(database_url, "SELECT position FROM my_log") == [stored.position]
        definitions = _scalars(database_url, "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")
        assert not [d for d in definitions if "event_events_v" in str(d)]


def _indexes(url: str) -> dict[str, str]:
    """The events table's indexes by name, with their definitions (SQLite's constraint
    indexes have none)."""
    postgresql = url.startswith("postgresql")
    engine = create_engine(driver_url(url))
    try:
        with engine.connect() as conn:
            if postgresql:
                statement = (
                    "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'event_events'"
                )
            else:
                statement = (
                    "SELECT name, coalesce(sql, '') FROM sqlite_master "
                    "WHERE type = 'index' AND tbl_name = 'event_events'"
                )
            return {name: sql for name, sql in conn.execute(text(statement))}
    finally:
        engine.dispose()


def _scalars(url: str, sql: str) -> list[object]:
    engine = create_engine(driver_url(url))
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql)).scalars())
    finally:
        engine.dispose()


# --- the target ----------------------------------------------------------------------------


def _outbox_event(seq: int, event_type: str = "order.created") -> OutboxEvent:
    return OutboxEvent(
        seq=seq,
        event_id=str(uuid.UUID(int=seq)),
        event_type=event_type,
        payload=f'{{"n": {seq}, "text": "ü"}}',
        logged_at=datetime(2024, 5, 6, 7, 8, 9, 123456 + seq, tzinfo=UTC),
    )


def _target(url: str, name: str = "store") -> EventStoreTarget:
    config = EventStoreTargetConfig(
        kind="event_store", url=url, type_prefix=["tidings", "orders"], server_id=3
    )
    return EventStoreTarget(name, config)


def test_target_maps_outbox_events(database_url: str) -> None:
    target = _target(database_url)
    events = [_outbox_event(1), _outbox_event(2, "order.paid")]
    try:
        assert target.atomic is True
        assert target.publish(events) == [None, None]
        assert target.publish(events) == [None, None]  # a re-publish after a crash
        assert target.publish([]) == []
    finally:
        target.close()

    store = EventStore(database_url, server_id=3)
    try:
        stored = store.read()
    finally:
        store.close()
    assert [e.type for e in stored] == [
        ("tidings", "orders", "order.created"),
        ("tidings", "orders", "order.paid"),
    ]
    assert [e.id for e in stored] == [EventId(3, 1, 1), EventId(3, 1, 2)]
    assert [e.payload for e in stored] == [
        '{"n": 1, "text": "ü"}'.encode(),
        '{"n": 2, "text": "ü"}'.encode(),
    ]
    assert {e.payload_kind for e in stored} == {PayloadKind.JSON}
    assert [e.source_timestamp_us for e in stored] == [
        1_714_979_289_123_457,
        1_714_979_289_123_458,
    ]
    assert [e.outbox_event_id for e in stored] == [e.event_id for e in events]


def test_targets_with_different_prefixes_on_one_store_each_store_the_event(
    database_url: str,
) -> None:
    """The relay routes one outbox event to two targets that are the same store."""
    orders, audit = (
        EventStoreTarget(
            name,
            EventStoreTargetConfig(kind="event_store", url=database_url, type_prefix=[name]),
        )
        for name in ("orders", "audit")
    )
    events = [_outbox_event(1, "OrderPlaced"), _outbox_event(2, "OrderPaid")]
    try:
        for _ in range(2):  # the second round is a re-publish after a crash
            assert orders.publish(events) == [None, None]
            assert audit.publish(events) == [None, None]
    finally:
        orders.close()
        audit.close()

    store = EventStore(database_url)
    try:
        stored = store.read()
        by_id = store.by_outbox_ids([e.event_id for e in events])
    finally:
        store.close()
    assert [e.type for e in stored] == [
        ("orders", "OrderPlaced"),
        ("orders", "OrderPaid"),
        ("audit", "OrderPlaced"),
        ("audit", "OrderPaid"),
    ]
    assert by_id == {
        events[0].event_id: [stored[0], stored[2]],
        events[1].event_id: [stored[1], stored[3]],
    }


def test_target_exposes_its_config_read_only(database_url: str) -> None:
    target = _target(database_url)
    try:
        assert target.config.url == database_url
        assert target.config.type_prefix == ["tidings", "orders"]
        assert target.config.server_id == 3
        with pytest.raises(AttributeError):
            target.config = target.config  # type: ignore[misc]
    finally:
        target.close()


def test_target_fails_the_whole_call_on_an_invalid_type(database_url: str) -> None:
    target = _target(database_url)
    try:
        with pytest.raises(TargetCallFailed) as raised:
            target.publish([_outbox_event(1), _outbox_event(2, "*")])
    finally:
        target.close()

    assert "'store'" in str(raised.value)
    assert "reserved as a query wildcard" in str(raised.value)
    store = EventStore(database_url, server_id=3)
    try:
        assert store.count() == 0
    finally:
        store.close()


def test_target_reports_an_unusable_database_as_unavailable(tmp_path: Path) -> None:
    target = _target(f"sqlite:///{tmp_path / 'missing' / 'events.db'}", name="archive")
    try:
        with pytest.raises(TargetUnavailable) as raised:
            target.publish([_outbox_event(1), _outbox_event(2)])
    finally:
        target.close()

    assert "'archive'" in str(raised.value)
    assert "unable to open database file" in str(raised.value)


def test_target_opens_the_store_once_the_database_is_usable(tmp_path: Path) -> None:
    directory = tmp_path / "later"
    target = _target(f"sqlite:///{directory / 'events.db'}")
    try:
        with pytest.raises(TargetUnavailable):
            target.publish([_outbox_event(1)])
        directory.mkdir()
        assert target.publish([_outbox_event(1)]) == [None]
    finally:
        target.close()


def test_register_sessions_stores_each_session_as_if_alone_in_one_transaction(
    store: EventStore,
) -> None:
    """Group commit: own session numbers and timestamps, one id sequence, and outbox
    duplicates recognised across the sessions of one call."""
    [first] = store.register([_event("a")])
    results = store.register_sessions(
        [
            [_event("b", outbox_id="x"), _event("c")],
            [],
            [_event("b", outbox_id="x"), _event("d", outbox_id="y")],
            [_event("b", outbox_id="x")],
        ]
    )
    assert [len(r.events) for r in results] == [2, 0, 2, 1]
    assert [len(r.fresh) for r in results] == [2, 0, 1, 0]
    stored_x = results[0].events[0]
    assert results[2].events[0] == stored_x and results[3].events[0] == stored_x
    fresh = [e for r in results for e in r.fresh]
    assert [e.id.session for e in fresh] == [2, 2, 3]
    assert [e.id.instance for e in fresh] == [2, 3, 4]
    assert [e.position for e in fresh] == [2, 3, 4]
    assert fresh[0].timestamp_us == fresh[1].timestamp_us <= fresh[2].timestamp_us
    assert first.timestamp_us <= fresh[0].timestamp_us
    assert store.read(0, 10) == [first, *fresh]
    [after] = store.register([_event("e")])
    assert (after.id.session, after.id.instance, after.position) == (4, 5, 5)


def test_register_sessions_is_all_or_nothing(store: EventStore) -> None:
    with pytest.raises(StoreError, match="reserved as a query wildcard"):
        store.register_sessions([[_event("a")], [_event("b", "*")]])
    assert store.count() == 0


def test_plain_sql_column_order_matches_the_table() -> None:
    """Rows of ``select(events_table)`` and of the plain-SQL statements decode alike."""
    from tidings.server.store import EVENT_COLUMNS, events_table

    assert tuple(column.name for column in events_table.columns) == EVENT_COLUMNS


def test_sqlite_registers_reach_the_database_file_without_a_commit_checkpointing(
    tmp_path: Path,
) -> None:
    """The store's own thread copies the WAL into the database file: a register far below
    SQLite's automatic checkpoint threshold is in the file (not only in the WAL) within a
    few of the thread's intervals. A copy of the file alone, without its WAL, shows it."""
    store = EventStore(f"sqlite:///{tmp_path / 'ev.db'}")
    try:
        stored = store.register(
            [_event("checkpointed", payload=b"x" * 100, kind=PayloadKind.BINARY) for _ in range(50)]
        )
        copy = tmp_path / "copy.db"
        deadline = time.monotonic() + 10
        found = 0
        while time.monotonic() < deadline:
            copy.write_bytes((tmp_path / "ev.db").read_bytes())
            engine = create_engine(f"sqlite:///{copy}")
            try:
                with engine.connect() as conn:
                    found = conn.execute(text("SELECT count(*) FROM event_events")).scalar_one()
            except OperationalError:  # not even the schema is in the file yet
                found = 0
            finally:
                engine.dispose()
            if found == len(stored):
                break
            time.sleep(0.2)
        assert found == len(stored)
    finally:
        store.close()


def test_a_side_transaction_may_read_then_write_while_others_append(tmp_path) -> None:
    """On SQLite a transaction begun for reading cannot write once another connection has
    committed ("database is locked" at once, no waiting): the stream server failed to start
    that way on a fresh database. Side transactions hold the write lock from the start."""
    import threading
    import time

    from tidings.events.model import NewEvent
    from tidings.server.store import EventStore

    url = f"sqlite:///{tmp_path}/side.db"
    store, other = EventStore(url), EventStore(url)
    done = threading.Event()

    def append() -> None:
        while not done.is_set():
            other.register([NewEvent(("side", "load"))])

    thread = threading.Thread(target=append)
    thread.start()
    try:
        for index in range(30):
            with store.transaction("read, then write") as conn:
                conn.exec_driver_sql("SELECT count(*) FROM event_events").all()
                time.sleep(0.005)  # the other writer would commit here
                conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS side_rows (n INTEGER)")
                conn.exec_driver_sql(f"INSERT INTO side_rows VALUES ({index})")
    finally:
        done.set()
        thread.join()
        other.close()
    with store.transaction("count") as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM side_rows").scalar() == 30
    store.close()
