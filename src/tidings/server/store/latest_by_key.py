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

A large table is read in pages (the Eventer answers each with a reply of bounded size): a
page is the keys whose newest event comes after a given event, the previous page's last. A
key's newest event comes after position ``p`` exactly when the key has an event after ``p``,
and then its newest is among those, so a page reads only the events after its cursor. The
cursor is an event id, not a position (positions are local to a store; ids are what a
client sees): its position is that of the newest event of the id's server up to the id, which
is the event itself, or, if retention deleted it meanwhile, an earlier one, so that a page
then repeats keys already sent but never skips one. Between pages the store may change: a key
changed meanwhile is sent again with its newer event, never an older one, so folding the
pages in order gives the table as of the last page.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from tidings.errors import StoreError
from tidings.events.matching import validate_query_type
from tidings.events.model import EventId, EventType, encode_type
from tidings.events.validation import INT64_MIN, require_int
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
    store: EventStore,
    event_type: EventType,
    chunk_rows: int = 10_000,
    after: EventId | None = None,
) -> Generator[list[tuple[Any, ...]], None, None]:
    """The stored rows (:data:`EVENT_COLUMNS`) of the newest event of each key of
    ``event_type`` (exact: no ``?`` or ``*``) whose newest event comes after the event
    ``after`` (None: every key), in the store's order, in chunks, all from one snapshot
    (consume the generator in one go, or close it)."""
    checked = validate_query_type(tuple(event_type))
    if any(segment in ("?", "*") for segment in checked):
        raise StoreError(f"latest by key: expected an exact event type, got {list(checked)}")
    if after is not None:
        for field in ("server", "session", "instance"):
            require_int(f"latest by key: lastEventId.{field}", getattr(after, field), INT64_MIN)
    with store.snapshot("latest by key") as conn:
        sql = DriverCursor.of(conn)
        key = key_expression(sql)
        columns = ", ".join(f"e.{column}" for column in EVENT_COLUMNS)
        # A payload of kind json was checked to be strict JSON when it was registered.
        statement = (
            f"SELECT {columns} FROM event_events e WHERE e.position IN ("
            f"SELECT max(position) FROM event_events WHERE type = ? AND position > ? "
            f"AND payload_kind = 'json' AND ({key}) IS NOT NULL GROUP BY {key}) "
            "ORDER BY e.position"
        )
        try:
            start = 0 if after is None else position_of(sql, after)
            yield from sql.chunks(statement, [encode_type(checked), start], chunk_rows)
        except sql.error as exc:
            raise StoreError(
                f"event store {store.url}: cannot read the latest by key: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


def key_expression(sql: DriverCursor) -> str:
    """The SQL of a row's key (NULL if it has none) on the cursor's database."""
    return _POSTGRESQL_KEY if sql.postgresql else _SQLITE_KEY


def position_of(sql: DriverCursor, event_id: EventId) -> int:
    """The position of the newest event of ``event_id``'s server up to ``event_id`` (the
    event itself unless retention deleted it), 0 if none: a server's events are stored in
    the order of their ids, so none of its events after that position is older."""
    rows = sql.rows(
        "SELECT position FROM event_events WHERE server = ? AND (session, instance) <= (?, ?) "
        "ORDER BY server DESC, session DESC, instance DESC LIMIT 1",
        [event_id.server, event_id.session, event_id.instance],
    )
    return int(rows[0][0]) if rows else 0
