"""The reads behind the log's retention rules (:mod:`tidings.server.log_retention`): which
types are stored, where a count limit falls, where an event id falls, and which events
are the newest of their key.

A count limit is a position: the ``n``-th newest event of some types, found by walking the
log backwards from its end (the table is clustered by position) over ``n`` of them; every
event of those types at or below it is beyond the newest ``n - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidings.errors import StoreError
from tidings.events.matching import QueryType
from tidings.events.model import EventId, EventType, encode_type
from tidings.server.store.driver import DriverCursor
from tidings.server.store.facade import EventStore
from tidings.server.store.latest_by_key import key_expression, position_of
from tidings.server.store.schema import decode_type, event_types_table, events_table
from tidings.server.store.type_patterns import type_condition_of


def known_types(store: EventStore) -> list[EventType]:
    """Every type ever stored (the ``event_types`` table: it only grows)."""
    with store.snapshot("read the stored types") as conn:
        sql = DriverCursor.of(conn)
        rows = sql.rows(f"SELECT type FROM {event_types_table.name} ORDER BY type")
    return [decode_type(text) for (text,) in rows]


def nth_newest_position(store: EventStore, types: Sequence[QueryType], n: int) -> int:
    """The position of the ``n``-th newest event (``n`` >= 1) of ``types``; 0 if there are
    fewer."""
    if n < 1 or not types:
        return 0
    with store.snapshot("find a count limit") as conn:
        sql = DriverCursor.of(conn)
        try:
            condition, params = type_condition_of(sql, store, "1 = 1", [], types)
            if condition is None:
                return 0
            rows = sql.rows(
                f"SELECT position FROM {events_table.name} WHERE {condition} "
                "ORDER BY position DESC LIMIT 1 OFFSET ?",
                [*params, n - 1],
            )
        except sql.error as exc:
            raise StoreError(f"event store {store.url}: cannot find a count limit: {exc}") from exc
    return int(rows[0][0]) if rows else 0


def id_position(store: EventStore, event_id: EventId) -> int:
    """The position of the newest event of ``event_id``'s server up to ``event_id`` (0 if
    none): what follows it in the log holds every later event of that server."""
    with store.snapshot("find an event id") as conn:
        return position_of(DriverCursor.of(conn), event_id)


def newest_of_keys(store: EventStore, types: Sequence[EventType]) -> set[int]:
    """The positions of the newest event of every key of each of ``types`` (exact types),
    as a table load (:mod:`.latest_by_key`) picks them."""
    found: set[int] = set()
    with store.snapshot("find the newest event of each key") as conn:
        sql = DriverCursor.of(conn)
        key = key_expression(sql)
        try:
            for event_type in types:
                rows = sql.rows(
                    f"SELECT max(position) FROM {events_table.name} WHERE type = ? "
                    f"AND payload_kind = 'json' AND ({key}) IS NOT NULL GROUP BY {key}",
                    [encode_type(event_type)],
                )
                found.update(int(position) for (position,) in rows)
        except sql.error as exc:
            raise StoreError(
                f"event store {store.url}: cannot find the newest event of each key: {exc}"
            ) from exc
    return found
