"""Hat queries (``QueryData``) answered from the event store's indexes.

Every filter, the order and ``unique_type`` are translated to one SQL statement that runs
unchanged on SQLite and PostgreSQL, so a query reads the index ranges it needs instead of the
whole log. Type filters become equality on the stored type text (a type without wildcards),
or a range over the stored text of the segments before the first wildcard: the type is
stored as canonical JSON (``_encode_type``) in byte order, so the types sharing those leading
segments are one contiguous index range. A trailing ``*`` is answered exactly that way; a
``?`` is checked in Python on the rows the range has already narrowed, and then
``max_results`` stops the reading instead of being a SQL ``LIMIT``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from sqlalchemy import ColumnElement, Row, Select, and_, func, or_, select, tuple_
from sqlalchemy.sql.elements import UnaryExpression

from tidings.server.matching import ANY_ONE, ANY_REST, QueryType, TypeMatcher, validate_query_type
from tidings.server.store import (
    _INT64_MIN,
    EventId,
    EventStore,
    PayloadKind,
    StoredEvent,
    StoreError,
    _encode_type,
    _events,
    _from_row,
    _require_int,
)

Order = Literal["ascending", "descending"]
OrderBy = Literal["timestamp", "source_timestamp"]

#: Rows fetched per round trip when types are matched in Python and the result is streamed.
_FETCH_BATCH = 500


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
                _require_int(f"query: {name}", value, _INT64_MIN)
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
    type_condition, exact = _type_filter(query.event_types)
    statement = _statement(query, type_condition)
    with store._transaction("query") as conn:
        if exact:
            if query.max_results is not None:
                statement = statement.limit(query.max_results)
            return [_from_row(row) for row in conn.execute(statement)]
        # Only a type filter can be inexact, so event_types is set here.
        matcher = TypeMatcher(query.event_types or ())
        rows = conn.execute(statement, execution_options={"yield_per": _FETCH_BATCH})
        return _first_matching(rows, matcher, query.max_results)


def _first_matching(
    rows: Iterable[Row[Any]], matcher: TypeMatcher, limit: int | None
) -> list[StoredEvent]:
    """The first ``limit`` (all if None) rows whose type ``matcher`` accepts, as events."""
    found: list[StoredEvent] = []
    for row in rows:
        event = _from_row(row)
        if matcher.matches(event.type):
            found.append(event)
            if len(found) == limit:
                break
    return found


def _statement(query: QueryData, type_condition: ColumnElement[bool] | None) -> Select[Any]:
    """The ordered SELECT of the query, one event per type if ``unique_type``, no limit."""
    conditions = _conditions(query)
    if type_condition is not None:
        conditions.append(type_condition)
    if not query.unique_type:
        return select(_events).where(*conditions).order_by(*_order(query, _events.c))
    # The first row of each type in the query's order; filtering by type afterwards keeps or
    # drops whole partitions, so a Python type check on the result stays correct.
    rank = func.row_number().over(partition_by=_events.c.type, order_by=_order(query, _events.c))
    ranked = select(_events, rank.label("type_rank")).where(*conditions).subquery()
    columns = [ranked.c[column.name] for column in _events.columns]
    return select(*columns).where(ranked.c.type_rank == 1).order_by(*_order(query, ranked.c))


def _conditions(query: QueryData) -> list[ColumnElement[bool]]:
    """The SQL conditions of every filter except the type filter."""
    c = _events.c
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


def _type_filter(
    query_types: Sequence[QueryType] | None,
) -> tuple[ColumnElement[bool] | None, bool]:
    """The SQL condition narrowing rows to ``query_types`` (None: no narrowing) and whether
    it is exact, i.e. needs no check in Python."""
    if query_types is None or (ANY_REST,) in query_types:
        return None, True
    exact = not any(ANY_ONE in query_type for query_type in query_types)
    equal: set[str] = set()
    ranges: set[str] = set()
    for query_type in query_types:
        fixed = _fixed_prefix(query_type)
        if fixed == query_type:
            equal.add(_encode_type(query_type))  # "[]" for (), which matches no stored type
            continue
        if not fixed:
            return None, exact  # starts with "?": every type is a candidate
        if query_type[len(fixed)] == ANY_REST:
            equal.add(_encode_type(fixed))  # "*" matching zero segments
        ranges.add(_encode_type(fixed)[:-1] + ",")
    return _or_conditions(equal, ranges), exact


def _fixed_prefix(query_type: QueryType) -> QueryType:
    """The segments of ``query_type`` before its first wildcard."""
    for index, segment in enumerate(query_type):
        if segment in (ANY_ONE, ANY_REST):
            return query_type[:index]
    return query_type


def _or_conditions(equal: set[str], prefixes: set[str]) -> ColumnElement[bool]:
    """Type equal to one of ``equal`` or starting with one of ``prefixes``.

    A prefix ends with ``,``; the types starting with it are those from it up to the same text
    with ``-`` (the next character) instead, a range the type index serves, unlike ``LIKE``,
    which would also need escaping of the JSON text.
    """
    type_ = _events.c.type
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
            _require_int(f"query: event id {part}", getattr(event_id, part), _INT64_MIN)


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
