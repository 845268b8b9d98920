"""Hat type matching and QueryData semantics, on real SQLite files and a real PostgreSQL."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import create_engine, text

from tests.support.server_helpers import event_to_sbs
from tidings.db import driver_url
from tidings.errors import StoreError
from tidings.events.matching import TypeMatcher, matches, validate_query_type
from tidings.events.model import EventId, NewEvent, PayloadKind, StoredEvent
from tidings.events.query import QueryData
from tidings.server.eventer.query_replies import plan_reply
from tidings.server.store import EventStore
from tidings.server.store import planning as store_planning
from tidings.server.store import queries as query_module
from tidings.server.store.queries import query_events
from tidings.wire import codec

# --- matching ----------------------------------------------------------------------------

MATCH_CASES = [
    # (event type, query type, matches)
    (("a",), ("a",), True),
    (("a",), ("b",), False),
    (("a", "b"), ("a",), False),
    (("a",), ("a", "b"), False),
    (("a", "b"), ("a", "?"), True),
    (("a",), ("a", "?"), False),
    (("a", "b", "c"), ("a", "?"), False),
    (("a", "b", "c"), ("?", "b", "?"), True),
    (("a", "b", "c"), ("?", "c", "?"), False),
    (("a",), ("a", "*"), True),
    (("a", "b", "c"), ("a", "*"), True),
    (("b", "a"), ("a", "*"), False),
    (("a", "b"), ("?", "*"), True),
    (("a",), ("?", "*"), True),
    (("a",), ("*",), True),
    (("a", "b", "c"), ("*",), True),
    ((), ("*",), True),
    (("a",), (), False),
    ((), (), True),
    (("a", "b"), ("a", "?", "*"), True),
    (("a",), ("a", "?", "*"), False),
    (("?",), ("?",), True),
    (("x", "*y"), ("x", "*y"), True),
]


@pytest.mark.parametrize(("event_type", "query_type", "expected"), MATCH_CASES)
def test_matches(event_type: tuple[str, ...], query_type: tuple[str, ...], expected: bool) -> None:
    assert matches(event_type, query_type) is expected
    assert TypeMatcher([query_type]).matches(event_type) is expected


@pytest.mark.parametrize(
    "query_type", [("*", "a"), ("a", "*", "b"), ("*", "*"), ["a"], ("a", 1), "a"]
)
def test_invalid_query_types_are_refused(query_type: object) -> None:
    with pytest.raises(StoreError, match="query type"):
        validate_query_type(query_type)
    with pytest.raises(StoreError, match="query type"):
        TypeMatcher([query_type])  # type: ignore[list-item]


def test_type_matcher_agrees_with_matches_on_random_types() -> None:
    rng = random.Random(3)
    segments = ["a", "b", "c"]
    for _ in range(300):
        query_types = [_random_query_type(rng, segments) for _ in range(rng.randint(0, 6))]
        matcher = TypeMatcher(query_types)
        for _ in range(30):
            event_type = tuple(rng.choice(segments) for _ in range(rng.randint(1, 4)))
            expected = any(matches(event_type, query_type) for query_type in query_types)
            assert matcher.matches(event_type) is expected, (event_type, query_types)


def test_type_matcher_without_query_types_matches_nothing() -> None:
    assert not TypeMatcher([]).matches(("a",))


def _random_query_type(rng: random.Random, segments: list[str]) -> tuple[str, ...]:
    body = tuple(rng.choice([*segments, "?"]) for _ in range(rng.randint(0, 3)))
    return (*body, "*") if rng.random() < 0.3 else body


# --- QueryData validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"t_from": 1.5}, "t_from must be an int"),
        ({"server_id": True}, "server_id must be an int"),
        ({"max_results": 2**63}, "max_results must be between"),
        ({"event_ids": [EventId(1, 1, 1)]}, "event_ids must be a tuple"),
        ({"event_ids": ((1, 1, 1),)}, "event_ids must hold EventId"),
        ({"event_ids": (EventId(1, 2**64, 1),)}, "event id session"),
        ({"event_types": (("a", "*", "b"),)}, "'\\*' is allowed only as the last"),
        ({"event_types": ["a"]}, "event_types must be a tuple"),
        ({"payload": (b"x", PayloadKind.BINARY)}, "payload must be a"),
        ({"order": "up"}, "order must be one of ascending, descending"),
        ({"order_by": "position"}, "order_by must be one of"),
        ({"unique_type": 1}, "unique_type must be a bool"),
    ],
)
def test_malformed_queries_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(StoreError, match=message):
        QueryData(**fields)  # type: ignore[arg-type]


# --- query semantics on a store -----------------------------------------------------------


class _Clock:
    """Stands in for ``time`` in the store module, so sessions get chosen timestamps."""

    def __init__(self) -> None:
        self.now_us = 0

    def time_ns(self) -> int:
        return self.now_us * 1000


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(store_planning, "time", SimpleNamespace(time_ns=fake.time_ns))
    return fake


@pytest.fixture
def stores(database_url: str) -> Iterator[tuple[EventStore, EventStore]]:
    """Two servers' stores on one database: server 1 and server 2."""
    first, second = EventStore(database_url, server_id=1), EventStore(database_url, server_id=2)
    yield first, second
    first.close()
    second.close()


def _new(
    *type_: str, source: int | None = None, payload: tuple[PayloadKind, bytes] | None = None
) -> NewEvent:
    kind, data = payload if payload is not None else (None, None)
    return NewEvent(type=type_, payload=data, payload_kind=kind, source_timestamp_us=source)


#: Stands for "every event of the corpus" in expected results.
ALL: set[tuple[int, int, int]] = set()
JSON_1 = (PayloadKind.JSON, b"1")
BIN_0 = (PayloadKind.BINARY, b"\x00")


@pytest.fixture
def corpus(stores: tuple[EventStore, EventStore], clock: _Clock) -> list[StoredEvent]:
    """Sessions with equal timestamps, equal source timestamps, missing source timestamps,
    two servers and type-prefix neighbours (("a","b") vs ("a","bc")); returned by position."""
    one, two = stores
    sessions: list[tuple[EventStore, int, list[NewEvent]]] = [
        (one, 1000, [_new("a", "b", "c", source=50), _new("a", "b"), _new("a", "x", source=10)]),
        (one, 2000, [_new("a", "b", "c", source=5, payload=JSON_1), _new("b", source=20)]),
        (two, 2000, [_new("a", "b", "c", source=5), _new("a", "bc", source=7, payload=BIN_0)]),
        (one, 3000, [_new("a", "b", "c", "d"), _new("x", "y", source=20, payload=JSON_1)]),
        (one, 3000, [_new("a", "b", source=30, payload=BIN_0), _new("a", "*b")]),
        (two, 4000, [_new("a", "b"), _new("a", 'b"', "c", source=1)]),
    ]
    stored: list[StoredEvent] = []
    for store, timestamp_us, events in sessions:
        clock.now_us = timestamp_us
        stored.extend(store.register(events))
    return stored


def _ids(events: list[StoredEvent]) -> list[tuple[int, int, int]]:
    return [(e.id.server, e.id.session, e.id.instance) for e in events]


def _query(stores: tuple[EventStore, EventStore], **fields: object) -> list[tuple[int, int, int]]:
    return _ids(query_events(stores[0], QueryData(**fields)))  # type: ignore[arg-type]


def test_default_order_is_latest_first_ties_by_event_id(
    stores: tuple[EventStore, EventStore], corpus: list[StoredEvent]
) -> None:
    assert _query(stores) == [
        (2, 2, 4), (2, 2, 3),
        (1, 4, 9), (1, 4, 8), (1, 3, 7), (1, 3, 6),
        (2, 1, 2), (2, 1, 1), (1, 2, 5), (1, 2, 4),
        (1, 1, 3), (1, 1, 2), (1, 1, 1),
    ]  # fmt: skip


def test_ascending_by_timestamp_ties_by_event_id(
    stores: tuple[EventStore, EventStore], corpus: list[StoredEvent]
) -> None:
    assert _query(stores, order="ascending") == [
        (1, 1, 1), (1, 1, 2), (1, 1, 3),
        (1, 2, 4), (1, 2, 5), (2, 1, 1), (2, 1, 2),
        (1, 3, 6), (1, 3, 7), (1, 4, 8), (1, 4, 9),
        (2, 2, 3), (2, 2, 4),
    ]  # fmt: skip


@pytest.mark.parametrize("order", ["ascending", "descending"])
def test_source_timestamp_order_puts_missing_ones_last(
    stores: tuple[EventStore, EventStore], corpus: list[StoredEvent], order: str
) -> None:
    with_source = [
        (2, 2, 4), (1, 2, 4), (2, 1, 1), (2, 1, 2), (1, 1, 3),
        (1, 2, 5), (1, 3, 7), (1, 4, 8), (1, 1, 1),
    ]  # fmt: skip
    without_source = [(1, 1, 2), (1, 3, 6), (1, 4, 9), (2, 2, 3)]
    if order == "descending":
        # Equal source timestamps (5: (1,2,4) and (2,1,1); 20: (1,2,5) and (1,3,7)) keep
        # their event-id order in the query's direction.
        with_source = [
            (1, 1, 1), (1, 4, 8), (1, 3, 7), (1, 2, 5), (1, 1, 3),
            (2, 1, 2), (2, 1, 1), (1, 2, 4), (2, 2, 4),
        ]  # fmt: skip
        without_source.reverse()
    result = _query(stores, order=order, order_by="source_timestamp")
    assert result == with_source + without_source


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"server_id": 2}, {(2, 1, 1), (2, 1, 2), (2, 2, 3), (2, 2, 4)}),
        ({"server_id": 3}, set()),
        ({"event_ids": (EventId(1, 2, 5), EventId(2, 1, 1), EventId(9, 9, 9))},
         {(1, 2, 5), (2, 1, 1)}),
        ({"event_types": (("a", "b"),)}, {(1, 1, 2), (1, 4, 8), (2, 2, 3)}),
        ({"event_types": (("a", "?"),)},
         {(1, 1, 2), (1, 1, 3), (2, 1, 2), (1, 4, 8), (1, 4, 9), (2, 2, 3)}),
        ({"event_types": (("a", "b", "*"),)},
         {(1, 1, 1), (1, 1, 2), (1, 2, 4), (2, 1, 1), (1, 3, 6), (1, 4, 8), (2, 2, 3)}),
        ({"event_types": (("?", "?", "c"),)}, {(1, 1, 1), (1, 2, 4), (2, 1, 1), (2, 2, 4)}),
        ({"event_types": (("a", "*b"),)}, {(1, 4, 9)}),
        ({"event_types": (('a', 'b"', "*"),)}, {(2, 2, 4)}),
        ({"event_types": (("*",),)}, ALL),
        ({"event_types": ((),)}, set()),
        ({"event_types": (("b",), ("x", "*"))}, {(1, 2, 5), (1, 3, 7)}),
        ({"t_from": 2000, "t_to": 3000},
         {(1, 2, 4), (1, 2, 5), (2, 1, 1), (2, 1, 2), (1, 3, 6), (1, 3, 7), (1, 4, 8), (1, 4, 9)}),
        ({"t_from": 3001}, {(2, 2, 3), (2, 2, 4)}),
        ({"t_to": 1000}, {(1, 1, 1), (1, 1, 2), (1, 1, 3)}),
        ({"source_t_from": 20}, {(1, 1, 1), (1, 2, 5), (1, 3, 7), (1, 4, 8)}),
        ({"source_t_to": 5}, {(1, 2, 4), (2, 1, 1), (2, 2, 4)}),
        ({"source_t_from": 5, "source_t_to": 10}, {(1, 2, 4), (2, 1, 1), (2, 1, 2), (1, 1, 3)}),
        ({"payload": JSON_1}, {(1, 2, 4), (1, 3, 7)}),
        ({"payload": BIN_0}, {(2, 1, 2), (1, 4, 8)}),
        ({"payload": (PayloadKind.SBS, b"1")}, set()),
        ({"server_id": 1, "event_types": (("a", "*"),), "t_from": 2000, "source_t_to": 30,
          "payload": BIN_0}, {(1, 4, 8)}),
        ({"event_types": (("?", "b", "*"),), "t_to": 2000, "source_t_from": 6},
         {(1, 1, 1)}),
    ],
)  # fmt: skip
def test_each_filter_and_combinations(
    stores: tuple[EventStore, EventStore],
    corpus: list[StoredEvent],
    fields: dict[str, object],
    expected: set[tuple[int, int, int]],
) -> None:
    if expected is ALL:
        expected = set(_ids(corpus))
    assert set(_query(stores, **fields)) == expected


@pytest.mark.parametrize(
    "fields",
    [
        {"max_results": 0},
        {"max_results": -5},
        {"t_from": 2001, "t_to": 2000},
        {"source_t_from": 6, "source_t_to": 5},
        {"event_ids": ()},
        {"event_types": ()},
    ],
)
def test_queries_that_match_nothing_give_empty_results(
    stores: tuple[EventStore, EventStore], corpus: list[StoredEvent], fields: dict[str, object]
) -> None:
    assert _query(stores, **fields) == []


def test_unique_type_keeps_the_latest_when_descending(
    stores: tuple[EventStore, EventStore], corpus: list[StoredEvent]
) -> None:
    result = query_events(stores[0], QueryData(event_types=(("a", "*"),), unique_type=True))
    assert [(e.type, e.id) for e in result] == [
        (("a", 'b"', "c"), EventId(2, 2, 4)),
        (("a", "b"), EventId(2, 2, 3)),
        (("a", "*b"), EventId(1, 4, 9)),
        (("a", "b", "c", "d"), EventId(1, 3, 6)),
        (("a", "bc"), EventId(2, 1, 2)),
        (("a", "b", "c"), EventId(2, 1, 1)),  # same timestamp as (1,2,4): greater id wins
        (("a", "x"), EventId(1, 1, 3)),
    ]


def test_unique_type_keeps_the_earliest_when_ascending_then_max_results(
    stores: tuple[EventStore, EventStore], corpus: list[StoredEvent]
) -> None:
    query = QueryData(event_types=(("a", "?"),), unique_type=True, order="ascending")
    assert _ids(query_events(stores[0], query)) == [(1, 1, 2), (1, 1, 3), (2, 1, 2), (1, 4, 9)]
    limited = replace(query, max_results=2)
    assert _ids(query_events(stores[0], limited)) == [(1, 1, 2), (1, 1, 3)]


def test_unique_type_by_source_timestamp(
    stores: tuple[EventStore, EventStore], corpus: list[StoredEvent]
) -> None:
    query = QueryData(
        event_types=(("a", "b"), ("a", "b", "c")),
        unique_type=True,
        order_by="source_timestamp",
        max_results=5,
    )
    # ("a","b") has one event with a source timestamp; ("a","b","c") its greatest is 50.
    assert _ids(query_events(stores[0], query)) == [(1, 1, 1), (1, 4, 8)]


@pytest.mark.parametrize("order", ["ascending", "descending"])
@pytest.mark.parametrize("order_by", ["timestamp", "source_timestamp"])
def test_unique_type_among_events_named_by_id(
    stores: tuple[EventStore, EventStore], corpus: list[StoredEvent], order: str, order_by: str
) -> None:
    named = (*(e.id for e in corpus[::2]), EventId(9, 9, 9))
    for types in (None, (("a", "*"),), (("?", "b", "*"),)):
        for limit in (None, 2):
            query = QueryData(
                event_ids=named,
                event_types=types,
                unique_type=True,
                order=order,  # type: ignore[arg-type]
                order_by=order_by,  # type: ignore[arg-type]
                max_results=limit,
            )
            assert _ids(query_events(stores[0], query)) == _ids(_reference(corpus, query))


@pytest.mark.parametrize("types", [None, (("a", "*"),), (("?", "*"),), (("a", "?"), ("b",))])
@pytest.mark.parametrize("order", ["ascending", "descending"])
def test_max_results_keeps_the_first_in_order(
    stores: tuple[EventStore, EventStore],
    corpus: list[StoredEvent],
    types: tuple[tuple[str, ...], ...] | None,
    order: str,
) -> None:
    full = _query(stores, event_types=types, order=order)
    for limit in (1, 3, len(full), len(full) + 5):
        assert _query(stores, event_types=types, order=order, max_results=limit) == full[:limit]


def test_random_queries_agree_with_a_reference(
    stores: tuple[EventStore, EventStore], corpus: list[StoredEvent]
) -> None:
    """Property-style: random combinations of every field against a plain Python model."""
    rng = random.Random(7)
    segments = ["a", "b", "c", "x", "bc"]
    for _ in range(60):
        query = _random_query(rng, segments)
        assert _ids(query_events(stores[0], query)) == _ids(_reference(corpus, query)), query


def _random_query(rng: random.Random, segments: list[str]) -> QueryData:
    def maybe(value: object) -> object:
        return value if rng.random() < 0.3 else None

    types = tuple(_random_query_type(rng, segments) for _ in range(rng.randint(1, 3)))
    return QueryData(
        server_id=maybe(rng.choice([1, 2])),  # type: ignore[arg-type]
        event_types=maybe(types),  # type: ignore[arg-type]
        t_from=maybe(rng.choice([1000, 2000, 3000])),  # type: ignore[arg-type]
        t_to=maybe(rng.choice([2000, 3000, 4000])),  # type: ignore[arg-type]
        source_t_from=maybe(rng.choice([5, 20])),  # type: ignore[arg-type]
        source_t_to=maybe(rng.choice([20, 50])),  # type: ignore[arg-type]
        payload=maybe(rng.choice([JSON_1, BIN_0])),  # type: ignore[arg-type]
        order=rng.choice(["ascending", "descending"]),
        order_by=rng.choice(["timestamp", "source_timestamp"]),
        unique_type=rng.random() < 0.5,
        max_results=maybe(rng.randint(1, 6)),  # type: ignore[arg-type]
    )


def _reference(events: list[StoredEvent], query: QueryData) -> list[StoredEvent]:
    """The Hat semantics written out directly, for comparison."""
    selected = [e for e in events if _reference_selects(e, query)]
    selected.sort(key=lambda e: _reference_key(e, query))
    if query.unique_type:
        seen: set[tuple[str, ...]] = set()
        selected = [e for e in selected if not (e.type in seen or seen.add(e.type))]
    return selected if query.max_results is None else selected[: query.max_results]


def _reference_selects(event: StoredEvent, q: QueryData) -> bool:
    source = event.source_timestamp_us
    payload = None if event.payload_kind is None else (event.payload_kind, event.payload)
    return (
        (q.server_id is None or event.id.server == q.server_id)
        and (q.event_ids is None or event.id in q.event_ids)
        and (q.event_types is None or any(matches(event.type, t) for t in q.event_types))
        and (q.t_from is None or event.timestamp_us >= q.t_from)
        and (q.t_to is None or event.timestamp_us <= q.t_to)
        and (q.source_t_from is None or (source is not None and source >= q.source_t_from))
        and (q.source_t_to is None or (source is not None and source <= q.source_t_to))
        and (q.payload is None or payload == q.payload)
    )


def _reference_key(event: StoredEvent, q: QueryData) -> tuple[int, ...]:
    sign = -1 if q.order == "descending" else 1
    key = event.timestamp_us if q.order_by == "timestamp" else event.source_timestamp_us
    missing = 1 if key is None else 0
    parts = (key or 0, event.id.server, event.id.session, event.id.instance)
    return (missing, *(sign * part for part in parts))


# --- type patterns resolved through the table of known types -------------------------------

ODD_TYPES: list[tuple[str, ...]] = [
    ("a", "b"),
    ("a", "b", "c"),
    ("x", "a", "b"),
    ('q"', "ü"),
    ("\\",),
    ("\\", "b"),
    ("a\\", "b"),
    ('"',),
    ("",),
    ("", "b"),
    ("a,b",),
    ("a", ",b"),
    ("[x]", "b"),
    ("ü€😀", "z"),
    ("\x00nul", "b"),
    ("\ud800", "b"),
    ("a-", "b"),
    ("?x", "*y"),
]

ODD_PATTERNS: list[tuple[str, ...]] = [
    ("?",),
    ("?", "b"),
    ("?", "*"),
    ("*",),
    ("?", "?", "*"),
    ("?", "a", "?"),
    ("\\", "*"),
    ("\\",),
    ('q"', "?"),
    ("a\\", "?"),
    ("a", "*"),
    ("a", "?"),
    ("", "?"),
    ("a,b", "*"),
    ("a", ",b"),
    ("ü€😀", "*"),
    ("\x00nul", "?"),
    ("\ud800", "*"),
    ("?x", "*y"),
    ("nothing", "*"),
]


@pytest.fixture
def odd_corpus(stores: tuple[EventStore, EventStore], clock: _Clock) -> list[StoredEvent]:
    """A session of every odd type on each server, the second with source timestamps on
    half of them, and a synced session of a third server: its types reach the types table
    too."""
    one, two = stores
    clock.now_us = 10
    stored = one.register([_new(*t) for t in ODD_TYPES])
    clock.now_us = 20
    stored += two.register(
        [_new(*t, source=i if i % 2 else None) for i, t in enumerate(reversed(ODD_TYPES))]
    )
    synced = [
        StoredEvent(0, EventId(3, 1, i + 1), t, 15, 100 + i, None, None, None)
        for i, t in enumerate([("?x", "*y"), ("synced", "only"), ("\\", "b")])
    ]
    stored += one.append_synced(synced)
    return stored


#: Query shapes each pattern is tried with.
ODD_SHAPES: list[dict[str, object]] = [
    {},
    {"unique_type": True},
    {"unique_type": True, "order": "ascending"},
    {"unique_type": True, "order_by": "source_timestamp"},
    {"unique_type": True, "order_by": "source_timestamp", "order": "ascending"},
    {"max_results": 3, "order": "ascending"},
]


def test_patterns_over_odd_types_agree_with_a_reference(
    stores: tuple[EventStore, EventStore], odd_corpus: list[StoredEvent]
) -> None:
    for pattern in ODD_PATTERNS:
        for shape in ODD_SHAPES:
            query = QueryData(event_types=(pattern,), **shape)  # type: ignore[arg-type]
            expected = _ids(_reference(odd_corpus, query))
            assert _ids(query_events(stores[0], query)) == expected, query


def test_several_patterns_with_a_leading_wildcard(
    stores: tuple[EventStore, EventStore], odd_corpus: list[StoredEvent]
) -> None:
    query = QueryData(event_types=(("?", "b"), ("a", "*"), ("synced", "?")), unique_type=True)
    result = query_events(stores[0], query)
    assert {e.type for e in result} == {
        ("a", "b"), ("a", "b", "c"), ("a", ",b"), ("\\", "b"), ("a\\", "b"), ("", "b"),
        ("[x]", "b"), ("\x00nul", "b"), ("\ud800", "b"), ("a-", "b"), ("synced", "only"),
    }  # fmt: skip
    assert _ids(result) == _ids(_reference(odd_corpus, query))


def test_a_known_type_without_events_is_simply_absent(
    stores: tuple[EventStore, EventStore], database_url: str, corpus: list[StoredEvent]
) -> None:
    """Retention may delete every event of a type; the types table keeps the type."""
    engine = create_engine(driver_url(database_url))
    try:
        with engine.begin() as conn:
            conn.execute(text("""DELETE FROM event_events WHERE type = '["a","bc"]'"""))
    finally:
        engine.dispose()
    remaining = [e for e in corpus if e.type != ("a", "bc")]
    for fields in ({"unique_type": True}, {"event_types": (("a", "?"),), "unique_type": True}):
        query = QueryData(**fields)  # type: ignore[arg-type]
        assert _ids(query_events(stores[0], query)) == _ids(_reference(remaining, query))


def test_queries_over_more_types_than_one_statement_takes(
    stores: tuple[EventStore, EventStore], clock: _Clock
) -> None:
    """1,200 types: type lists and positions are read in chunks whose results are merged."""
    rng = random.Random(5)
    types = [("many", f"t{i:04d}") for i in range(1200)]
    stored: list[StoredEvent] = []
    for session in range(4):
        clock.now_us = rng.choice([100, 200, 300])  # equal timestamps across sessions too
        batch = [_new(*t, source=rng.choice([None, rng.randint(0, 50)])) for t in types]
        stored += stores[session % 2].register(batch)
    stored += stores[0].register([_new("other")])
    queries = [
        QueryData(event_types=(("many", "?"),), unique_type=True),
        QueryData(event_types=(("?", "?"),), unique_type=True, max_results=700),
        QueryData(event_types=(("many", "*"),), unique_type=True, order="ascending"),
        QueryData(event_types=(("?", "?"),), unique_type=True, order_by="source_timestamp"),
        QueryData(event_types=(("?", "?"),), max_results=900, order_by="source_timestamp"),
        QueryData(event_types=(("many", "?"),), max_results=2000, order="ascending"),
        QueryData(event_types=(("?", "?"),), server_id=2, t_to=200, unique_type=True),
    ]
    for query in queries:
        assert _ids(query_events(stores[0], query)) == _ids(_reference(stored, query)), query


@pytest.mark.slow
def test_latest_per_type_over_many_events_agrees_with_brute_force(database_url: str) -> None:
    """150,000 events over 3,000 types, each type's events spread over many sessions."""
    rng = random.Random(11)
    types = [("load", f"group{i % 7}", f"type{i}") for i in range(3000)]
    store = EventStore(database_url)
    try:
        for _ in range(30):
            store.register(
                [
                    _new(*rng.choice(types), source=rng.choice([None, rng.randrange(10**6)]))
                    for _ in range(5000)
                ]
            )
        everything: list[StoredEvent] = []
        while page := store.read(everything[-1].position if everything else 0, limit=50_000):
            everything.extend(page)
        assert len(everything) == 150_000
        queries = [
            QueryData(unique_type=True),
            QueryData(unique_type=True, order="ascending"),
            QueryData(unique_type=True, order_by="source_timestamp"),
            QueryData(unique_type=True, order_by="source_timestamp", order="ascending"),
            QueryData(event_types=(("?", "group3", "?"),), unique_type=True, max_results=100),
            QueryData(event_types=(("load", "*"),), unique_type=True, source_t_to=10**5),
            QueryData(event_types=(("?", "?", "type42"),)),
        ]
        for query in queries:
            expected = (
                _brute_force_first_per_type(everything, query)
                if query.unique_type
                else _reference(everything, query)
            )
            assert query_events(store, query) == expected, query
    finally:
        store.close()


def _brute_force_first_per_type(events: list[StoredEvent], query: QueryData) -> list[StoredEvent]:
    """``unique_type`` by one pass keeping each type's first event in the query's order:
    faster than _reference's full sort on a large corpus, and an independent computation."""
    first: dict[tuple[str, ...], tuple[tuple[int, ...], StoredEvent]] = {}
    for event in events:
        if _reference_selects(event, query):
            key = _reference_key(event, query)
            kept = first.get(event.type)
            if kept is None or key < kept[0]:
                first[event.type] = (key, event)
    ordered = [event for _, event in sorted(first.values(), key=lambda kept: kept[0])]
    return ordered if query.max_results is None else ordered[: query.max_results]


# --- plan choice ---------------------------------------------------------------------------

#: Type sets from one type to nearly all: exact, ranges ("*"), listed ("?"), many exact.
PLAN_TYPE_SETS: list[tuple[tuple[str, ...], ...]] = [
    (("p", "g1", "t3"),),
    (("p", "g0", "t1"), ("q", "x")),
    (("p", "g2", "*"),),
    (("p", "*"),),
    (("p", "?", "t1"),),
    (("?", "?", "?"),),
    tuple(("p", f"g{i % 3}", f"t{i}") for i in range(20)),
]


@pytest.fixture
def plan_corpus(stores: tuple[EventStore, EventStore], clock: _Clock) -> list[StoredEvent]:
    """30 types ("p", group, t) and two ("q", x) over sessions of both servers with equal
    and out-of-order timestamps, source timestamps missing on about half of the events."""
    rng = random.Random(17)
    types = [("p", f"g{g}", f"t{i}") for g in range(3) for i in range(10)]
    types += [("q", "x"), ("q", "y")]
    stored: list[StoredEvent] = []
    for session in range(14):
        clock.now_us = rng.choice([100, 200, 200, 300, 400])
        batch = [
            _new(
                *t,
                source=rng.choice([None, rng.randint(0, 30)]),
                payload=rng.choice([None, JSON_1, BIN_0]),
            )
            for t in rng.sample(types, rng.randint(3, len(types)))
        ]
        stored += stores[session % 2].register(batch)
    return stored


@pytest.mark.parametrize("plan", ["estimated", "per_type", "in_order"])
def test_both_plans_of_ordered_queries_agree_with_a_reference(
    stores: tuple[EventStore, EventStore],
    plan_corpus: list[StoredEvent],
    monkeypatch: pytest.MonkeyPatch,
    plan: str,
) -> None:
    """An ordered query with max_results reads either each type's first events or the order
    index filtered by type; whichever is chosen, the result is the same, event for event."""
    if plan != "estimated":
        monkeypatch.setattr(query_module, "_per_type_is_cheaper", lambda *_: plan == "per_type")
    filters: list[dict[str, object]] = [{}, {"server_id": 2, "t_from": 200}, {"source_t_to": 20}]
    for types in PLAN_TYPE_SETS:
        for extra in filters:
            for order in ("ascending", "descending"):
                for order_by in ("timestamp", "source_timestamp"):
                    for limit in (1, 4, 25, 1000, None):
                        for unique_type in (False, True):
                            query = QueryData(
                                event_types=types,
                                order=order,  # type: ignore[arg-type]
                                order_by=order_by,  # type: ignore[arg-type]
                                max_results=limit,
                                unique_type=unique_type,
                                **extra,  # type: ignore[arg-type]
                            )
                            expected = _reference(plan_corpus, query)
                            assert query_events(stores[0], query) == expected, query


def test_the_estimate_reads_each_type_for_few_types_and_the_order_index_for_many(
    stores: tuple[EventStore, EventStore],
    plan_corpus: list[StoredEvent],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    choices: list[bool] = []
    estimate = query_module._per_type_is_cheaper

    def spy(*args: object) -> bool:
        choices.append(estimate(*args))  # type: ignore[arg-type]
        return choices[-1]

    monkeypatch.setattr(query_module, "_per_type_is_cheaper", spy)
    for types in ((("p", "g1", "t3"),), (("p", "?", "t1"),), (("p", "*"),), (("?", "?", "?"),)):
        query_events(stores[0], QueryData(event_types=types, max_results=3))
    assert choices == [True, True, False, False]


def test_resolved_patterns_see_types_registered_later(
    stores: tuple[EventStore, EventStore], corpus: list[StoredEvent], clock: _Clock
) -> None:
    """Patterns with "?" are resolved once per set of known types: a type registered later,
    by this store or another one on the database, is found by the next query."""
    query = QueryData(event_types=(("a", "?"),), unique_type=True)
    before = query_events(stores[0], query)
    clock.now_us = 5000
    added = stores[1].register([_new("a", "new")])
    assert query_events(stores[0], query) == [*added, *before]
    clock.now_us = 6000
    added += stores[0].register([_new("a", "newer", source=3)])
    assert query_events(stores[0], query) == [added[1], added[0], *before]


def test_many_event_ids(stores: tuple[EventStore, EventStore], clock: _Clock) -> None:
    """More ids than one statement takes: read in chunks, ordered and cut in Python."""
    rng = random.Random(23)
    stored: list[StoredEvent] = []
    for session in range(4):
        clock.now_us = rng.choice([100, 200])
        batch = [_new("ids", f"t{i % 7}", source=rng.choice([None, i])) for i in range(300)]
        stored += stores[session % 2].register(batch)
    # Synced events of a server whose ids need 64 bits, after small ones in each chunk.
    stored += stores[0].append_synced(
        [
            StoredEvent(0, EventId(9, 2**40 + i, 2**62 + i), ("ids", "t1"), 150, None, *[None] * 3)
            for i in range(5)
        ]
    )
    named = tuple(e.id for e in rng.sample(stored, 700)) + tuple(e.id for e in stored[-5:])
    for fields in (
        {},
        {"unique_type": True},
        {"order_by": "source_timestamp", "max_results": 650},
        {"order": "ascending", "event_types": (("ids", "t3"),), "max_results": 50},
    ):
        query = QueryData(event_ids=named, **fields)  # type: ignore[arg-type]
        assert query_events(stores[0], query) == _reference(stored, query), fields


def test_a_reply_with_kept_encodings_is_the_reply_encoded_whole(tmp_path: Path) -> None:
    """Bounded queries' replies are built from each event's kept encoding (small payloads)
    and big ones are encoded each time; either way the body is what encoding the whole
    reply at once gives, asked once or again (then from the kept encodings)."""
    store = EventStore(f"sqlite:///{tmp_path / 'events.db'}")
    hat_data = codec.encode("Hat", "Data", {"module": ("none", None), "type": "T", "data": b""})
    try:
        store.register(
            [
                NewEvent(("r", "json"), b'{"a": 1}', PayloadKind.JSON, source_timestamp_us=-7),
                NewEvent(("r", "none")),
                NewEvent(("r", "big"), b"x" * 5000, PayloadKind.BINARY),
                NewEvent(("r", "sbs"), hat_data, PayloadKind.SBS, source_timestamp_us=3),
            ]
        )
        events = store.read(0, 100)
        whole = codec.encode(codec.EVENTER, "MsgQueryRes", [event_to_sbs(e) for e in events])
        for query in (
            QueryData(event_types=(("r", "*"),), max_results=10, order="ascending"),
            QueryData(event_types=(("r", "*"),), order="ascending"),  # bulk: no bound
        ):
            for _ in range(2):
                plan = plan_reply(store, query)
                assert plan.body == whole
                assert plan.count == len(events)
    finally:
        store.close()
