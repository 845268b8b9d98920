"""Reading the log in position order: what a cursor-keeping consumer (an FTN18 stream) reads.

Appends hold the store's append lock until they commit, so positions become visible in
increasing order: once a reader has seen position ``p``, no event at or below ``p`` can
appear later. A read therefore reports, besides the events, how far it looked
(:attr:`PositionRead.scanned`): up to the last event it returns if it filled its limit,
else up to the store's last position in the same snapshot. Events up to ``scanned`` that
were not returned do not match the read's types, so a consumer filtering by type can move
its cursor past them without losing anything that commits late.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidings.errors import StoreError
from tidings.events.matching import QueryType
from tidings.events.model import StoredEvent
from tidings.server.store.driver import DriverCursor
from tidings.server.store.facade import EventStore
from tidings.server.store.schema import EVENT_COLUMNS, events_from_rows, events_table
from tidings.server.store.type_patterns import type_condition_of


@dataclass(frozen=True, slots=True)
class PositionRead:
    """Events in position order, and the position the read looked up to."""

    events: list[StoredEvent]
    scanned: int


def read_positions(
    store: EventStore,
    after: int,
    limit: int,
    types: Sequence[QueryType] | None = None,
) -> PositionRead:
    """Up to ``limit`` events after position ``after`` whose type matches one of ``types``
    (``None``: any type), in position order; see the module docstring for ``scanned``."""
    with store.snapshot("read by position") as conn:
        sql = DriverCursor.of(conn)
        try:
            [(last,)] = sql.rows(f"SELECT coalesce(max(position), 0) FROM {events_table.name}")
            if last <= after:
                return PositionRead([], after)
            condition, params = type_condition_of(
                sql, store, "position > ? AND position <= ?", [after, last], types
            )
            if condition is None:
                return PositionRead([], last)
            rows = sql.rows(
                f"SELECT {', '.join(EVENT_COLUMNS)} FROM {events_table.name} WHERE {condition} "
                "ORDER BY position LIMIT ?",
                [*params, limit],
            )
        except sql.error as exc:
            raise StoreError(
                f"event store {store.url}: cannot read by position: {type(exc).__name__}: {exc}"
            ) from exc
    events = events_from_rows(rows)
    scanned = events[-1].position if len(events) == limit else last
    return PositionRead(events, scanned)


def count_after(store: EventStore, after: int, types: Sequence[QueryType] | None = None) -> int:
    """How many events after position ``after`` match ``types`` (a consumer's lag)."""
    with store.snapshot("count by position") as conn:
        sql = DriverCursor.of(conn)
        condition, params = type_condition_of(sql, store, "position > ?", [after], types)
        if condition is None:
            return 0
        try:
            [(count,)] = sql.rows(
                f"SELECT count(*) FROM {events_table.name} WHERE {condition}", params
            )
        except sql.error as exc:
            raise StoreError(f"event store {store.url}: cannot count events: {exc}") from exc
    return int(count)


def read_newest(
    store: EventStore, limit: int, types: Sequence[QueryType] | None = None
) -> list[StoredEvent]:
    """The newest ``limit`` events matching ``types``, in position order."""
    with store.snapshot("read the newest events") as conn:
        sql = DriverCursor.of(conn)
        condition, params = type_condition_of(sql, store, "1 = 1", [], types)
        if condition is None:
            return []
        try:
            rows = sql.rows(
                f"SELECT {', '.join(EVENT_COLUMNS)} FROM {events_table.name} "
                f"WHERE {condition} ORDER BY position DESC LIMIT ?",
                [*params, limit],
            )
        except sql.error as exc:
            raise StoreError(f"event store {store.url}: cannot read the newest: {exc}") from exc
    return events_from_rows(rows[::-1])
