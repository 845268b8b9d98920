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
from tidings.server.query_types import type_condition, type_filter
from tidings.server.store import (
    EVENT_COLUMNS,
    DriverCursor,
    EventStore,
    events_from_rows,
    events_table,
)


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
            condition, params = "position > ? AND position <= ?", [after, last]
            if types is not None:
                found = type_filter(sql, store, tuple(types))
                if found is not None:
                    if found.is_empty():
                        return PositionRead([], last)
                    term, values = type_condition(sql, found, "type", filter_only=True)
                    condition += f" AND {term}"
                    params += values
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
