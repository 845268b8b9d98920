"""Who registered each event: the ``event_sources`` rows, written with the events, read by id.

The engine hands the store one :class:`~tidings.events.sources.Source` per event it stores;
the store keeps one row per run of consecutive events of a session with the same source (see
``event_sources`` in :mod:`.schema`): a session from one Eventer client costs one row, not
one per event. Outbox duplicates the store skips are not stored, so they have no source
either: the runs are taken over the events actually stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, and_, select

from tidings.events.model import EventId, StoredEvent
from tidings.events.sources import Source, SourceKind
from tidings.server.store.driver import DriverCursor
from tidings.server.store.schema import event_sources_table

_COLUMNS = "server, session, instance, kind, source_id, name"
_INSERT_SQL = f"INSERT INTO event_sources ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
#: PostgreSQL: one statement for all rows, as the events' own insert (see
#: :func:`~.planning.insert_event_rows`: psycopg's executemany runs a statement per row).
_INSERT_UNNEST_SQL = (
    f"INSERT INTO event_sources ({_COLUMNS}) SELECT * FROM unnest("
    "?::bigint[], ?::bigint[], ?::bigint[], ?::text[], ?::bigint[], ?::text[])"
)


def source_rows(
    inputs: Sequence[Sequence[StoredEvent]],
    sources: Sequence[Sequence[Source]],
    fresh: set[int],
) -> list[tuple[Any, ...]]:
    """The rows for the events stored now: ``inputs`` per session the stored event of each
    input (an outbox duplicate's slot holds the event stored earlier), ``sources`` the source
    of each input, ``fresh`` the positions stored by this call."""
    rows: list[tuple[Any, ...]] = []
    # An outbox event repeated in the call is stored once: its first input names it.
    seen: set[int] = set()
    for stored, session_sources in zip(inputs, sources, strict=True):
        last: tuple[int, int, Source] | None = None
        first: list[tuple[StoredEvent, Source]] = []
        for event, source in zip(stored, session_sources, strict=True):
            if event.position in fresh and event.position not in seen:
                seen.add(event.position)
                first.append((event, source))
        for event, source in sorted(first, key=lambda pair: pair[0].position):
            key = (event.id.server, event.id.session, source)
            if last != key:
                rows.append(
                    (
                        event.id.server,
                        event.id.session,
                        event.id.instance,
                        source.kind.value,
                        source.id,
                        source.name,
                    )
                )
                last = key
    return rows


def insert_sources(conn: DriverCursor, rows: list[tuple[Any, ...]]) -> None:
    """Insert :func:`source_rows`' rows, in one statement on PostgreSQL."""
    if not rows:
        return
    if conn.postgresql:
        conn.rows(_INSERT_UNNEST_SQL, [list(column) for column in zip(*rows, strict=True)])
    else:
        conn.executemany(_INSERT_SQL, rows)


def sources_of(conn: Connection, ids: Iterable[EventId]) -> dict[EventId, Source]:
    """The recorded source of each of ``ids`` that has one (events stored before sources
    were recorded, and events synced from a peer, have none)."""
    t = event_sources_table.c
    found: dict[EventId, Source] = {}
    for event_id in ids:
        row = conn.execute(
            select(t.kind, t.source_id, t.name)
            .where(
                and_(
                    t.server == event_id.server,
                    t.session == event_id.session,
                    t.instance <= event_id.instance,
                )
            )
            .order_by(t.instance.desc())
            .limit(1)
        ).first()
        if row is not None:
            found[event_id] = Source(SourceKind(row.kind), row.source_id, row.name)
    return found
