"""Hat queries (:class:`~tidings.events.query.QueryData`) answered from the event store's indexes.

Type patterns become conditions on the stored type text (:mod:`.type_patterns`).

Each query shape gets the plan that reads the fewest rows; the database's own planner is
left the choice only where every matching row is read anyway:

- ``unique_type``: one probe of a per-type index per row of ``event_types`` finds the first
  event of each type in the query's order (SQLite: a correlated ``LIMIT 1`` subquery giving
  the row's position; PostgreSQL: a ``LATERAL`` subquery, which it does not turn into a
  hash join over the log), then those few rows are ordered and cut to ``max_results``.
- ordered with ``max_results`` over a set of types: when the set holds a large share of the
  types, the timestamp (or source timestamp) index is read in the query's order with the
  type condition only filtering, stopping after ``max_results`` rows; when it holds few, the
  first ``max_results`` of each type are read from the per-type index and merged. The
  choice is an estimate from the numbers of known and matched types and of events.
- ordered by source timestamp: the events with one and then, only if ``max_results`` is not
  reached yet, those without (they come last in both directions), each an index range.
- ``event_ids``: the named events are read by id and ordered in Python.

Statements are plain SQL on the snapshot's driver connection (as the register path in the
store does): SQLAlchemy's per-statement and per-row work cost more than the statements of a
small query themselves. Rows are turned into events only once they are known to be in the
result, decoding each type's text once per query.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Literal, TypeVar

from tidings.errors import StoreError
from tidings.events.model import StoredEvent
from tidings.events.query import Order, QueryData
from tidings.server.store.driver import DriverCursor
from tidings.server.store.facade import EventStore
from tidings.server.store.schema import EVENT_COLUMNS, events_from_rows
from tidings.server.store.type_patterns import TypeFilter, type_condition, type_filter

#: The columns every statement selects, in this order (the rows are plain tuples).
_COLUMNS = EVENT_COLUMNS
_TYPE, _TIMESTAMP, _SOURCE = 4, 5, 6
#: Event ids per statement (three bound parameters each).
_ID_CHUNK = 500
#: The cost of one index seek, in rows read, for the choice of an ordered query's plan.
_SEEK_ROWS = 2.0
#: A latest-per-type result of up to this many events is ordered and cut by SQLite; a
#: longer one is fetched whole and sorted in Python.
_SORT_IN_PYTHON = 1000

_T = TypeVar("_T")


def query_events(store: EventStore, query: QueryData) -> list[StoredEvent]:
    """Return the events of ``store`` that ``query`` selects, in its order."""
    return [event for chunk in query_chunks(store, query) for event in chunk]


def query_chunks(
    store: EventStore, query: QueryData, chunk_events: int = 10_000
) -> Iterator[list[StoredEvent]]:
    """The events ``query`` selects, in its order, about ``chunk_events`` at a time.

    Ordered queries (with or without ``max_results``) read their rows as they go, so a
    result of any size costs one chunk of memory; latest-per-type and id queries, whose
    results are bounded by the known types or the named ids, come as one chunk. All chunks
    come from one snapshot of the store, held while the generator is iterated: consume it
    in one go.
    """
    for rows in query_rows(store, query, chunk_events):
        yield events_from_rows(rows)


def query_rows(
    store: EventStore, query: QueryData, chunk_rows: int = 10_000
) -> Iterator[list[tuple[Any, ...]]]:
    """:func:`query_chunks` as the stored rows (:data:`EVENT_COLUMNS`), not yet events: for
    readers that need less than the whole event of a row they have seen before (query
    replies keep rows' encodings)."""
    if query.matches_nothing():
        return
    with store.snapshot("query") as conn:
        sql = DriverCursor.of(conn)
        try:
            yield from _select(sql, store, query, chunk_rows)
        except sql.error as exc:
            raise StoreError(
                f"event store {store.url}: cannot query: {type(exc).__name__}: {exc}"
            ) from exc


def _select(
    sql: DriverCursor, store: EventStore, query: QueryData, chunk_rows: int
) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of the query's result, in order, in chunks."""
    types = type_filter(sql, store, query.event_types)
    if types is not None and types.is_empty():
        return
    if query.event_ids is not None:
        yield _by_ids(sql, query, types)
        return
    if query.unique_type:
        yield _first_per_type(sql, query, types)
        return
    limit = query.max_results
    per_type = types is not None and limit is not None and _per_type_is_cheaper(sql, types, limit)
    read = 0
    for part in _parts(query):
        if limit is not None and read == limit:
            break
        remaining = None if limit is None else limit - read
        if per_type:
            assert types is not None and remaining is not None
            statement, params = _top_per_type(sql, query, types, part, remaining)
        else:
            statement, params = _in_order(sql, query, types, part, remaining)
        for rows in sql.chunks(statement, params, chunk_rows):
            read += len(rows)
            yield rows


@dataclass(frozen=True, slots=True)
class _Part:
    """The events of one index range of an ordered query: the ones with a source timestamp
    (``present``), without one (``absent``), or all (``None``, ordering by timestamp)."""

    source: Literal["present", "absent"] | None
    #: The order key, before the event id. The events without a source timestamp are
    #: ordered by it too, which changes nothing but lets PostgreSQL read them in the order
    #: of its index (``IS NULL`` does not count as equality for index order there).
    key: Literal["timestamp_us", "source_timestamp_us"]


def _parts(query: QueryData) -> list[_Part]:
    """The parts of the query's order: events lacking a source timestamp come after all
    others when ordering by it (and fail any source bound)."""
    if query.order_by == "timestamp":
        return [_Part(None, "timestamp_us")]
    parts = [_Part("present", "source_timestamp_us")]
    if query.source_t_from is None and query.source_t_to is None:
        parts.append(_Part("absent", "source_timestamp_us"))
    return parts


# --- plans ----------------------------------------------------------------------------------


def _in_order(
    sql: DriverCursor, query: QueryData, types: TypeFilter | None, part: _Part, limit: int | None
) -> tuple[str, list[Any]]:
    """One part of an ordered query as one statement and its parameters.

    With a limit (and a type condition only when _top_per_type was estimated to read more)
    the plan is the order index, stopping after ``limit`` rows, and the type condition only
    filters them. SQLite, which has no statistics, would rather read by the type or the
    event id index and sort every event they give: ``+type`` and ``+server`` keep it off
    them; PostgreSQL would join a long list of types (see type_condition). Without a limit
    every matching event is read anyway, and the database plans.
    """
    unindexed = limit is not None and not sql.postgresql
    conditions, params = _filters(query, "e", part, unindexed_server=unindexed)
    if types is not None:
        condition, type_params = type_condition(sql, types, "e.type", filter_only=limit is not None)
        conditions.append(condition)
        params += type_params
    statement = f"SELECT {_columns('e')} FROM event_events e"
    if conditions:
        statement += f" WHERE {' AND '.join(conditions)}"
    statement += f" ORDER BY {_order_by('e', part.key, query.order)}"
    if limit is not None:
        statement += " LIMIT ?"
        params.append(limit)
    return statement, params


def _top_per_type(
    sql: DriverCursor, query: QueryData, types: TypeFilter, part: _Part, limit: int
) -> tuple[str, list[Any]]:
    """One part of an ordered query as the first ``limit`` events of each type (an index
    range of the per-type index each), merged, ordered and cut by the database: one
    statement and its parameters."""
    filters, filter_params = _filters(query, "p", part)
    inner = " AND ".join(["p.type = t.type", *filters])
    inner_order = _order_by("p", part.key, query.order)
    known, type_params = type_condition(sql, types, "t.type")
    if sql.postgresql:
        statement = (
            f"SELECT {_columns('x')} FROM event_types t CROSS JOIN LATERAL "
            f"(SELECT {_columns('p')} FROM event_events p WHERE {inner} "
            f"ORDER BY {inner_order} LIMIT ?) x "
            f"WHERE {known} ORDER BY {_order_by('x', part.key, query.order)} LIMIT ?"
        )
        params = [*filter_params, limit, *type_params, limit]
    else:
        statement = (
            f"SELECT {_columns('e')} FROM event_types t CROSS JOIN event_events e "
            f"WHERE {known} AND e.position IN (SELECT p.position FROM event_events p "
            f"WHERE {inner} ORDER BY {inner_order} LIMIT ?) "
            f"ORDER BY {_order_by('e', part.key, query.order)} LIMIT ?"
        )
        params = [*type_params, *filter_params, limit, limit]
    return statement, params


def _first_per_type(
    sql: DriverCursor, query: QueryData, types: TypeFilter | None
) -> list[tuple[Any, ...]]:
    """``unique_type``: each type's first event in the query's order, found with one probe
    of the per-type index per row of ``event_types`` (per part: a type lacking events with
    a source timestamp falls back to its first without one), then ordered and cut.

    With other filters a probe walks its type's index range in order to the first event
    passing them.
    """
    parts = _parts(query)
    known, type_params = ("", []) if types is None else type_condition(sql, types, "t.type")
    params: list[Any] = []
    if sql.postgresql:
        arms = []
        for index, part in enumerate(parts):
            filters, filter_params = _filters(query, "p", part)
            tag = f"{index} AS part, " if len(parts) > 1 else ""
            arms.append(
                f"SELECT {tag}{_columns('p')} FROM event_events p "
                f"WHERE {' AND '.join(['p.type = t.type', *filters])} "
                f"ORDER BY {_order_by('p', part.key, query.order)} LIMIT 1"
            )
            params += filter_params
        first = arms[0]
        if len(arms) > 1:
            union = " UNION ALL ".join(f"({arm})" for arm in arms)
            first = f"SELECT {_columns('u')} FROM ({union}) u ORDER BY u.part LIMIT 1"
        statement = (
            f"SELECT {_columns('x')} FROM event_types t CROSS JOIN LATERAL ({first}) x"
            + (f" WHERE {known}" if known else "")
            + f" ORDER BY {_result_order('x', query)}"
        )
        params += type_params
    else:
        probes = []
        for part in parts:
            filters, filter_params = _filters(query, "p", part)
            probes.append(
                f"(SELECT p.position FROM event_events p "
                f"WHERE {' AND '.join(['p.type = t.type', *filters])} "
                f"ORDER BY {_order_by('p', part.key, query.order)} LIMIT 1)"
            )
            params += filter_params
        # COALESCE stops at the first probe that finds an event.
        first = probes[0] if len(probes) == 1 else f"coalesce({', '.join(probes)})"
        statement = (
            f"SELECT {_columns('e')} FROM event_events e WHERE e.position IN "
            f"(SELECT {first} FROM event_types t" + (f" WHERE {known}" if known else "") + ")"
        )
        params += type_params
        if query.max_results is None or query.max_results >= _SORT_IN_PYTHON:
            # SQLite's sorter copies these wide rows: sorting the tuples is cheaper.
            rows = _sorted_rows(sql.rows(statement, params), query)
            return rows if query.max_results is None else rows[: query.max_results]
        statement += f" ORDER BY {_result_order('e', query)}"
    if query.max_results is not None:
        statement += " LIMIT ?"
        params.append(query.max_results)
    return sql.rows(statement, params)


def _by_ids(sql: DriverCursor, query: QueryData, types: TypeFilter | None) -> list[tuple[Any, ...]]:
    """The named events passing the other filters, read by id in chunks, then ordered,
    each type's first kept (``unique_type``) and cut in Python: a query names few events."""
    assert query.event_ids is not None
    conditions, filter_params = _filters(query, "e")
    if types is not None:
        condition, type_params = type_condition(sql, types, "e.type", filter_only=True)
        conditions.append(condition)
        filter_params += type_params
    # A join with the ids rather than "(server, session, instance) IN (VALUES ...)", for
    # which SQLite would scan the whole log.
    conditions[:0] = ["e.server = v.column1", "e.session = v.column2", "e.instance = v.column3"]
    where = " AND ".join(conditions)
    wanted = sorted({(i.server, i.session, i.instance) for i in query.event_ids})
    rows: list[tuple[Any, ...]] = []
    for chunk in _chunks(wanted, _ID_CHUNK):
        values = ", ".join(["(?, ?, ?)"] * len(chunk))
        statement = (
            f"SELECT {_columns('e')} FROM (VALUES {values}) v CROSS JOIN event_events e "
            f"WHERE {where}"
        )
        rows += sql.rows(statement, [*(x for key in chunk for x in key), *filter_params])
    rows = _sorted_rows(rows, query)
    if query.unique_type:
        seen: set[str] = set()
        first_of_type = []
        for row in rows:
            if row[_TYPE] not in seen:
                seen.add(row[_TYPE])
                first_of_type.append(row)
        rows = first_of_type
    return rows if query.max_results is None else rows[: query.max_results]


def _sorted_rows(rows: list[tuple[Any, ...]], query: QueryData) -> list[tuple[Any, ...]]:
    """``rows`` in the query's order (see _parts; event ids are unique, so no ties)."""
    descending = query.order == "descending"
    if query.order_by == "timestamp":
        return sorted(rows, key=itemgetter(_TIMESTAMP, 1, 2, 3), reverse=descending)
    present = [row for row in rows if row[_SOURCE] is not None]
    absent = [row for row in rows if row[_SOURCE] is None]
    present.sort(key=itemgetter(_SOURCE, 1, 2, 3), reverse=descending)
    absent.sort(key=itemgetter(1, 2, 3), reverse=descending)
    return present + absent


def _per_type_is_cheaper(sql: DriverCursor, types: TypeFilter, limit: int) -> bool:
    """Whether reading the first ``limit`` events of each matched type beats reading the
    order index until ``limit`` events of the matched types have passed.

    Estimated as if the events were spread evenly over the known types: the order index
    then yields a matched event every ``known / matched`` rows (reading at most the whole
    log), and each matched type costs a seek and ``min(limit, events / known)`` rows. The
    first grows with the number of matched types and the second shrinks, so the matched
    types are counted only up to where the order index wins.
    """
    known, first, last = sql.rows(
        "SELECT (SELECT count(*) FROM event_types), "
        "(SELECT min(position) FROM event_events), (SELECT max(position) FROM event_events)"
    )[0]
    if not known or first is None:
        return False  # no events: either plan reads nothing
    events = last - first + 1
    per_type_cost = _SEEK_ROWS + min(limit, events / known)
    # per-type cost < min(events, limit * known / matched) <=> matched below both bounds
    bound = min(events / per_type_cost, math.sqrt(limit * known / per_type_cost))
    threshold: int = max(1, math.ceil(bound))
    if types.listed is not None:
        return len(types.listed) < threshold
    condition, params = type_condition(sql, types, "t.type")
    matched = sql.rows(
        f"SELECT count(*) FROM (SELECT 1 FROM event_types t WHERE {condition} LIMIT ?) m",
        [*params, threshold],
    )[0][0]
    return bool(matched < threshold)


# --- SQL text -------------------------------------------------------------------------------


def _columns(alias: str) -> str:
    return ", ".join(f"{alias}.{column}" for column in _COLUMNS)


def _order_by(alias: str, key: str, order: Order) -> str:
    """The order key, then the event id, all in the query's direction: the column order of
    the index serving it."""
    direction = " DESC" if order == "descending" else ""
    return ", ".join(
        f"{alias}.{column}{direction}" for column in (key, "server", "session", "instance")
    )


def _result_order(alias: str, query: QueryData) -> str:
    """The query's order over rows with and without a source timestamp: missing ones last
    (a boolean sorts false first on both databases), then by event id."""
    if query.order_by == "timestamp":
        return _order_by(alias, "timestamp_us", query.order)
    source = _order_by(alias, "source_timestamp_us", query.order)
    return f"({alias}.source_timestamp_us IS NULL), {source}"


def _filters(
    query: QueryData, alias: str, part: _Part | None = None, *, unindexed_server: bool = False
) -> tuple[list[str], list[Any]]:
    """The conditions of every filter except types and event ids, on the events table
    under ``alias``, and their parameters; those of ``part`` too. ``unindexed_server``
    hides the server condition from SQLite's planner (see _in_order)."""
    conditions: list[str] = []
    params: list[Any] = []

    def add(condition: str, *values: Any) -> None:
        conditions.append(condition.replace("@", alias))
        params.extend(values)

    if part is not None and part.source is not None:
        add(f"@.source_timestamp_us IS {'NOT NULL' if part.source == 'present' else 'NULL'}")
    if query.server_id is not None:
        add(f"{'+' if unindexed_server else ''}@.server = ?", query.server_id)
    if query.t_from is not None:
        add("@.timestamp_us >= ?", query.t_from)
    if query.t_to is not None:
        add("@.timestamp_us <= ?", query.t_to)
    if query.source_t_from is not None:
        add("@.source_timestamp_us >= ?", query.source_t_from)
    if query.source_t_to is not None:
        add("@.source_timestamp_us <= ?", query.source_t_to)
    if query.payload is not None:
        kind, data = query.payload
        add("@.payload_kind = ? AND @.payload = ?", kind.value, data)
    return conditions, params


def _chunks(values: list[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]
