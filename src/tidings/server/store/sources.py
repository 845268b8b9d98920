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

from sqlalchemy import Connection, and_, delete, exists, select, tuple_

from tidings.events.model import EventId, StoredEvent
from tidings.events.sources import Source, SourceKind
from tidings.server.store.driver import DriverCursor
from tidings.server.store.schema import event_sources_table, events_table

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
    first_position: int,
) -> list[tuple[Any, ...]]:
    """The rows for the events stored now: ``inputs`` per session the stored event of each
    input (an outbox duplicate's slot holds the event stored first), ``sources`` the source
    of each input, ``first_position`` the position of the first event stored by this call.

    The call stored its events at consecutive positions, in input order: an input whose
    event's position is not above every one met so far was stored before, or is a repeat.
    This runs once per stored event on the write path, hence no more than a comparison each.
    """
    rows: list[tuple[Any, ...]] = []
    high = first_position - 1
    for stored, session_sources in zip(inputs, sources, strict=True):
        last: Source | None = None
        for event, source in zip(stored, session_sources, strict=True):
            if event.position <= high:
                continue
            high = event.position
            if source is last or source == last:
                continue
            last = source
            event_id = event.id
            rows.append(
                (
                    event_id.server,
                    event_id.session,
                    event_id.instance,
                    source.kind.value,
                    source.id,
                    source.name,
                )
            )
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


def forget_sources(conn: Connection, positions: Sequence[int]) -> None:
    """Before the events at ``positions`` are deleted: forget the source rows of the sessions
    that the deletion empties. A row names the source of a run of its session's events from
    its instance on, so a row is dropped only with the whole session; a session that keeps an
    event keeps every row (a later event's source is read from the row before it)."""
    e = events_table.c
    sessions = conn.execute(
        select(e.server, e.session).where(e.position.in_(positions)).distinct()
    ).all()
    if not sessions:
        return
    s = event_sources_table.c
    remaining = exists().where(
        and_(
            e.server == s.server,
            e.session == s.session,
            e.position.not_in(positions),
        )
    )
    conn.execute(
        delete(event_sources_table).where(
            and_(tuple_(s.server, s.session).in_([tuple(row) for row in sessions]), ~remaining)
        )
    )
