"""The newest event of every key among the JSON events of one type: the initial state of a
table that an intermediary folds from row-change events
(:mod:`tidings.intermediary.views.rows`: payload ``{"key": K, ...}``, or a CloudEvents
envelope with that as its ``data``).

Loading a table by replaying its whole history costs time in proportion to its history; the
newest event per key is what the fold of that history keeps, so this reads the type's rows
once in the database (the key taken out of the JSON there, grouped, the greatest position
kept) and sends only one event per key: time and bytes in proportion to the table. Keys
compare as JSON values (``1`` and ``"1"`` are two keys, as the fold keeps them apart).
Events of the type that are not JSON objects with a key are left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tidings.errors import StoreError
from tidings.events.matching import validate_query_type
from tidings.events.model import EventType, encode_type
from tidings.server.store.driver import DriverCursor
from tidings.server.store.facade import EventStore
from tidings.server.store.schema import EVENT_COLUMNS

_SQLITE_KEY = (
    "CASE WHEN json_type(CAST(payload AS TEXT), '$.specversion') IS NOT NULL "
    "THEN json_extract(CAST(payload AS TEXT), '$.data.key') "
    "ELSE json_extract(CAST(payload AS TEXT), '$.key') END"
)
_POSTGRESQL_KEY = (
    "CASE WHEN jsonb_exists(convert_from(payload, 'UTF8')::jsonb, 'specversion') "
    "THEN convert_from(payload, 'UTF8')::jsonb -> 'data' -> 'key' "
    "ELSE convert_from(payload, 'UTF8')::jsonb -> 'key' END"
)


def latest_by_key_rows(
    store: EventStore, event_type: EventType, chunk_rows: int = 10_000
) -> Iterator[list[tuple[Any, ...]]]:
    """The stored rows (:data:`EVENT_COLUMNS`) of the newest event of each key of
    ``event_type`` (exact: no ``?`` or ``*``), in the store's order, in chunks, all from one
    snapshot (consume the generator in one go)."""
    checked = validate_query_type(tuple(event_type))
    if any(segment in ("?", "*") for segment in checked):
        raise StoreError(f"latest by key: expected an exact event type, got {list(checked)}")
    with store.snapshot("latest by key") as conn:
        sql = DriverCursor.of(conn)
        key = _POSTGRESQL_KEY if sql.postgresql else _SQLITE_KEY
        columns = ", ".join(f"e.{column}" for column in EVENT_COLUMNS)
        # A payload of kind json was checked to be strict JSON when it was registered.
        statement = (
            f"SELECT {columns} FROM event_events e WHERE e.position IN ("
            f"SELECT max(position) FROM event_events WHERE type = ? "
            f"AND payload_kind = 'json' AND ({key}) IS NOT NULL GROUP BY {key}) "
            "ORDER BY e.position"
        )
        try:
            yield from sql.chunks(statement, [encode_type(checked)], chunk_rows)
        except sql.error as exc:
            raise StoreError(
                f"event store {store.url}: cannot read the latest by key: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
