"""Hat queries (``QueryData``) answered from the event store's indexes.

Type patterns are first resolved to the exact types they match, in Python (TypeMatcher),
against the store's table of distinct types (``event_types``: thousands of rows where the
log has millions). The types sharing the segments before a pattern's first wildcard are one
range of that table, since types are stored as canonical JSON (``encode_type``) in byte
order; a pattern starting with ``?`` reads the whole table. The events are then read with
equality on those types, so a ``?`` pattern never streams the log through Python, and every
filter, the order and ``max_results`` are SQL that runs unchanged on SQLite and PostgreSQL.

``unique_type`` finds, per matched type, the position of its first event in the query's
order with one probe of a per-type index (a correlated ``ORDER BY … LIMIT 1`` subquery per
row of ``event_types``), then reads those few events by position, ordered and limited. With
other filters the probe walks that type's index range in order to the first event passing
them. Long lists of types or positions are split into chunks whose ordered results are
merged in Python; all statements of a query see one snapshot of the store.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import islice
from typing import Any, Literal, TypeVar, get_args

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    and_,
    func,
    or_,
    select,
    tuple_,
)
from sqlalchemy.sql.elements import UnaryExpression

from tidings.server.matching import ANY_ONE, ANY_REST, QueryType, TypeMatcher, validate_query_type
from tidings.server.store import (
    INT64_MIN,
    EventId,
    EventStore,
    EventType,
    PayloadKind,
    StoredEvent,
    StoreError,
    decode_type,
    encode_type,
    event_from_row,
    event_types_table,
    events_table,
    require_int,
)

Order = Literal["ascending", "descending"]
OrderBy = Literal["timestamp", "source_timestamp"]

#: Values per ``IN`` list: bound parameters stay well below driver limits (SQLite 32766).
_IN_CHUNK = 500

_T = TypeVar("_T")

#: Decoding the stored type text is most of the Python time of resolving a pattern against
#: thousands of types; the text of a type never changes, so every query can reuse it.
_decode_type = lru_cache(maxsize=65_536)(decode_type)


@dataclass(frozen=True, slots=True)
class QueryData:
    """A Hat query; every filter that is set must hold (Hat QueryData).

    Timestamps are integer microseconds since the Unix epoch, bounds inclusive. Events lacking
    a source timestamp fail both source bounds and come last when ordered by source timestamp,
    in either direction. ``unique_type`` keeps one event per type, the first in the query's
    order (the latest when descending); ``max_results`` then cuts the result. Queries that can
    match nothing (``max_results <= 0``, a lower bound above its upper bound, an empty
    ``event_ids`` or ``event_types``) give an empty result rather than an error, as Hat does.
    """

    server_id: int | None = None
    event_ids: tuple[EventId, ...] | None = None
    event_types: tuple[QueryType, ...] | None = None
    t_from: int | None = None
    t_to: int | None = None
    source_t_from: int | None = None
    source_t_to: int | None = None
    payload: tuple[PayloadKind, bytes] | None = None
    order: Order = "descending"
    order_by: OrderBy = "timestamp"
    unique_type: bool = False
    max_results: int | None = None

    def __post_init__(self) -> None:
        """Refuse malformed queries here, so a bad client request never reaches the database."""
        for name in ("server_id", "t_from", "t_to", "source_t_from", "source_t_to", "max_results"):
            value = getattr(self, name)
            if value is not None:
                require_int(f"query: {name}", value, INT64_MIN)
        _validate_event_ids(self.event_ids)
        _validate_event_types(self.event_types)
        _validate_payload(self.payload)
        _require_choice("order", self.order, get_args(Order))
        _require_choice("order_by", self.order_by, get_args(OrderBy))
        if not isinstance(self.unique_type, bool):
            raise StoreError(f"query: unique_type must be a bool, not {self.unique_type!r}")

    def matches_nothing(self) -> bool:
        """Whether the query is empty by its own terms, without looking at the store."""
        return (
            (self.max_results is not None and self.max_results <= 0)
            or _inverted(self.t_from, self.t_to)
            or _inverted(self.source_t_from, self.source_t_to)
            or self.event_ids == ()
            or self.event_types == ()
        )


def query_events(store: EventStore, query: QueryData) -> list[StoredEvent]:
    """Return the events of ``store`` that ``query`` selects, in its order."""
    if query.matches_nothing():
        return []
    with store.snapshot("query") as conn:
        types = _resolve_types(conn, query.event_types)
        if types is not None and not types:
            return []
        if query.unique_type and query.event_ids is not None:
            # A few events named by id: read them all, keep each type's first in Python,
            # rather than probing every matched type's index range for them.
            everything = _run_ordered(
                conn, replace(query, max_results=None), _ordered_events(query, types)
            )
            return _first_of_each_type(everything, query.max_results)
        if query.unique_type:
            positions = [
                position
                for statement in _first_per_type(query, types)
                for position in conn.execute(statement).scalars()
                if position is not None
            ]
            statements = _by_positions(query, positions)
        else:
            statements = _ordered_events(query, types)
        return _run_ordered(conn, query, statements)


def _first_of_each_type(events: list[StoredEvent], limit: int | None) -> list[StoredEvent]:
    """The first of ``events`` (in order) of each type, the first ``limit`` (all if None)."""
    seen: set[EventType] = set()
    first: list[StoredEvent] = []
    for event in events:
        if event.type not in seen:
            seen.add(event.type)
            first.append(event)
            if len(first) == limit:
                break
    return first


def _run_ordered(
    conn: Connection, query: QueryData, statements: list[Select[Any]]
) -> list[StoredEvent]:
    """Run ordered SELECTs of disjoint events and merge their results in the query's order,
    each limited to ``max_results`` (one statement needs no merging)."""
    if query.max_results is not None:
        statements = [statement.limit(query.max_results) for statement in statements]
    parts = [[event_from_row(row) for row in conn.execute(s)] for s in statements]
    if len(parts) == 1:
        return parts[0]
    merged: Iterator[StoredEvent] = heapq.merge(*parts, key=_sort_key(query))
    return list(islice(merged, query.max_results))


def _resolve_types(conn: Connection, query_types: Sequence[QueryType] | None) -> list[str] | None:
    """The stored text of every known type ``query_types`` matches, sorted; None when every
    known type matches (no type condition is needed then).

    Only the candidate ranges of ``event_types`` are read (all of it for a pattern starting
    with ``?``) and matched in Python.
    """
    if query_types is None or (ANY_REST,) in query_types:
        return None
    column = event_types_table.c.type
    candidates = _type_candidates(query_types)
    statement = select(column).order_by(column)
    if candidates is not None:
        statement = statement.where(candidates)
    matcher = TypeMatcher(query_types)
    read = 0
    matched: list[str] = []
    for encoded in conn.execute(statement).scalars():
        read += 1
        if matcher.matches(_decode_type(encoded)):
            matched.append(encoded)
    if candidates is None and len(matched) == read:
        return None
    return matched


def _ordered_events(query: QueryData, types: list[str] | None) -> list[Select[Any]]:
    """The ordered SELECTs of a plain query, one per chunk of ``types``, without a limit."""
    conditions = _conditions(query, events_table.c)
    statement = select(events_table).where(*conditions).order_by(*_order(query, events_table.c))
    if types is None:
        return [statement]
    return [statement.where(events_table.c.type.in_(chunk)) for chunk in _chunks(types)]


def _first_per_type(query: QueryData, types: list[str] | None) -> list[Select[Any]]:
    """SELECTs of the position of each type's first event in the query's order (NULL for a
    type without one), one statement per chunk of ``types``.

    One correlated ``LIMIT 1`` subquery per row of ``event_types``, which the per-type index
    answers. The rows are fetched by position afterwards (_by_positions) rather than joined
    here: PostgreSQL plans such a join as a hash join over the whole log.
    """
    known = event_types_table
    if query.order_by == "timestamp":
        first = _first_position(query)
    else:
        # Events without a source timestamp come last in both directions, and NULL sorts
        # differently on the two databases: probe the ones with a source timestamp first,
        # and only for a type without any, the others (COALESCE stops at the first).
        first = _first_position(query, with_source=True)
        if query.source_t_from is None and query.source_t_to is None:
            first = func.coalesce(first, _first_position(query, with_source=False))
    statement = select(first).select_from(known)
    if types is None:
        return [statement]
    return [statement.where(known.c.type.in_(chunk)) for chunk in _chunks(types)]


def _by_positions(query: QueryData, positions: list[int]) -> list[Select[Any]]:
    """The ordered SELECTs of the events at ``positions``, in chunks."""
    statement = select(events_table).order_by(*_order(query, events_table.c))
    return [
        statement.where(events_table.c.position.in_(chunk)) for chunk in _chunks(sorted(positions))
    ]


def _first_position(query: QueryData, with_source: bool | None = None) -> ColumnElement[Any]:
    """The position of the first event of the current ``event_types`` row's type in the
    query's order, among those passing the query's filters (and having a source timestamp
    or not, if ``with_source`` says so).

    The ORDER BY is exactly the column order of the per-type index, NULL placement left to
    the database's default, which is also its index order (the callers separate the rows
    without source timestamp), so the database reads the type's range in order and stops
    at the first row passing the filters.
    """
    probe = events_table.alias("probe")
    c = probe.c
    key = c.timestamp_us if query.order_by == "timestamp" else c.source_timestamp_us
    terms = [key, c.server, c.session, c.instance]
    descending = query.order == "descending"
    conditions = [c.type == event_types_table.c.type, *_conditions(query, c)]
    if with_source is not None:
        source = c.source_timestamp_us
        conditions.append(source.is_not(None) if with_source else source.is_(None))
    return (
        select(c.position)
        .where(*conditions)
        .order_by(*[term.desc() if descending else term.asc() for term in terms])
        .limit(1)
        .correlate(event_types_table)
        .scalar_subquery()
    )


def _chunks(values: list[_T]) -> Iterator[list[_T]]:
    """``values`` in lists short enough for one ``IN``."""
    for start in range(0, len(values), _IN_CHUNK):
        yield values[start : start + _IN_CHUNK]


def _sort_key(query: QueryData) -> Callable[[StoredEvent], tuple[Any, ...]]:
    """The query's order in Python, for merging the ordered results of several chunks.

    The same as _order: the order key, then the event id, all in the query's direction;
    missing source timestamps last in both directions.
    """
    sign = -1 if query.order == "descending" else 1
    if query.order_by == "timestamp":
        return lambda e: (
            sign * e.timestamp_us,
            sign * e.id.server,
            sign * e.id.session,
            sign * e.id.instance,
        )
    return lambda e: (
        e.source_timestamp_us is None,
        sign * (e.source_timestamp_us or 0),
        sign * e.id.server,
        sign * e.id.session,
        sign * e.id.instance,
    )


def _conditions(query: QueryData, c: Any) -> list[ColumnElement[bool]]:
    """The SQL conditions of every filter except the type filter, on the columns ``c`` of
    the events table or an alias of it."""
    conditions: list[ColumnElement[bool]] = []
    if query.server_id is not None:
        conditions.append(c.server == query.server_id)
    if query.event_ids is not None:
        wanted = sorted({(i.server, i.session, i.instance) for i in query.event_ids})
        conditions.append(tuple_(c.server, c.session, c.instance).in_(wanted))
    if query.t_from is not None:
        conditions.append(c.timestamp_us >= query.t_from)
    if query.t_to is not None:
        conditions.append(c.timestamp_us <= query.t_to)
    if query.source_t_from is not None:
        conditions.append(c.source_timestamp_us >= query.source_t_from)
    if query.source_t_to is not None:
        conditions.append(c.source_timestamp_us <= query.source_t_to)
    if query.payload is not None:
        kind, data = query.payload
        conditions.append(and_(c.payload_kind == kind.value, c.payload == data))
    return conditions


def _order(query: QueryData, columns: Any) -> list[UnaryExpression[Any]]:
    """The ORDER BY terms: the order key, then the event id, all in the query's direction.

    Missing source timestamps sort last in both directions (Hat), then by event id.
    """
    descending = query.order == "descending"
    key = columns.timestamp_us if query.order_by == "timestamp" else columns.source_timestamp_us
    terms = [key, columns.server, columns.session, columns.instance]
    ordered = [term.desc() if descending else term.asc() for term in terms]
    if query.order_by == "source_timestamp":
        ordered[0] = ordered[0].nulls_last()
    return ordered


def _type_candidates(query_types: Sequence[QueryType]) -> ColumnElement[bool] | None:
    """The condition on ``event_types`` narrowing it to the types that may match
    ``query_types``; None when every type may (a pattern starts with ``?``)."""
    equal: set[str] = set()
    ranges: set[str] = set()
    for query_type in query_types:
        fixed = _fixed_prefix(query_type)
        if fixed == query_type:
            equal.add(encode_type(query_type))  # "[]" for (), which matches no stored type
            continue
        if not fixed:
            return None  # starts with "?" (a lone "*" never gets here): every type
        if query_type[len(fixed)] == ANY_REST:
            equal.add(encode_type(fixed))  # "*" matching zero segments
        ranges.add(encode_type(fixed)[:-1] + ",")
    return _or_conditions(equal, ranges)


def _fixed_prefix(query_type: QueryType) -> QueryType:
    """The segments of ``query_type`` before its first wildcard."""
    for index, segment in enumerate(query_type):
        if segment in (ANY_ONE, ANY_REST):
            return query_type[:index]
    return query_type


def _or_conditions(equal: set[str], prefixes: set[str]) -> ColumnElement[bool]:
    """Type equal to one of ``equal`` or starting with one of ``prefixes``.

    A prefix ends with ``,``; the types starting with it are those from it up to the same text
    with ``-`` (the next character) instead, a range the primary key serves, unlike ``LIKE``,
    which would also need escaping of the JSON text.
    """
    type_ = event_types_table.c.type
    conditions: list[ColumnElement[bool]] = []
    if equal:
        conditions.append(type_.in_(sorted(equal)))
    for prefix in sorted(prefixes):
        conditions.append(and_(type_ >= prefix, type_ < prefix[:-1] + "-"))
    return or_(*conditions)


def _inverted(lower: int | None, upper: int | None) -> bool:
    return lower is not None and upper is not None and lower > upper


def _require_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise StoreError(f"query: {name} must be one of {', '.join(choices)}, not {value!r}")


def _validate_event_ids(event_ids: object) -> None:
    """Event ids are a tuple of EventId with int64 parts, so the database can compare them."""
    if event_ids is None:
        return
    if not isinstance(event_ids, tuple):
        raise StoreError(f"query: event_ids must be a tuple of EventId, not {event_ids!r}")
    for event_id in event_ids:
        if not isinstance(event_id, EventId):
            raise StoreError(f"query: event_ids must hold EventId, not {event_id!r}")
        for part in ("server", "session", "instance"):
            require_int(f"query: event id {part}", getattr(event_id, part), INT64_MIN)


def _validate_event_types(event_types: object) -> None:
    if event_types is None:
        return
    if not isinstance(event_types, tuple):
        raise StoreError(f"query: event_types must be a tuple of types, not {event_types!r}")
    for query_type in event_types:
        validate_query_type(query_type)


def _validate_payload(payload: object) -> None:
    if payload is None:
        return
    if (
        not isinstance(payload, tuple)
        or len(payload) != 2
        or not isinstance(payload[0], PayloadKind)
        or not isinstance(payload[1], bytes)
    ):
        raise StoreError(f"query: payload must be a (PayloadKind, bytes) pair, not {payload!r}")
