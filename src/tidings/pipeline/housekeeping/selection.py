"""Which rows a housekeeping run takes, and deleting exactly those.

Only PUBLISHED rows go, last changed before the run's cutoff and logged before the current
UTC day (:class:`Selection`). A chunk's rows are deleted, attributes first, in one
transaction, and only while they are still PUBLISHED: a row that changed since it was read
stays (:func:`delete_rows`).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Column, Connection, Engine, Row, and_, bindparam, select
from sqlalchemy.sql.elements import ColumnElement

from tidings.events.outbox import EventStatus
from tidings.events.timeutil import as_utc
from tidings.outbox.schema import outbox_event, outbox_event_attribute

log = logging.getLogger("tidings.pipeline.housekeeping")

_PUBLISHED = EventStatus.PUBLISHED.value
_STILL_PUBLISHED = and_(
    outbox_event.c.seq == bindparam("b_seq"), outbox_event.c.status == _PUBLISHED
)
_DELETE_ATTRIBUTES = outbox_event_attribute.delete().where(
    outbox_event_attribute.c.event_id
    == select(outbox_event.c.event_id).where(_STILL_PUBLISHED).scalar_subquery()
)
_DELETE_EVENT = outbox_event.delete().where(_STILL_PUBLISHED)


@dataclass(frozen=True)
class Selection:
    """The rows that go: PUBLISHED, last changed before the cutoff, logged before today."""

    updated_before: datetime
    logged_before: datetime

    @classmethod
    def at(cls, now: datetime, older_than: timedelta) -> Selection:
        today = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return cls(updated_before=min(now - older_than, today), logged_before=today)

    def where(self) -> list[ColumnElement[bool]]:
        return [
            outbox_event.c.status == _PUBLISHED,
            outbox_event.c.updated_at < self.updated_before,
            outbox_event.c.logged_at < self.logged_before,
        ]


@dataclass(frozen=True)
class ChunkOutcome:
    """One chunk done: the rows read (and archived, in archive mode) and those deleted."""

    last_seq: int
    read: int
    archived: int
    deleted: int
    first_logged_at: datetime
    last_logged_at: datetime


def select_rows(
    conn: Connection,
    selection: Selection,
    after: int,
    size: int,
    columns: Sequence[Column[Any]],
) -> Sequence[Row[Any]]:
    """The next ``size`` selected rows after seq ``after``, in seq order."""
    query = (
        select(*columns)
        .where(*selection.where(), outbox_event.c.seq > after)
        .order_by(outbox_event.c.seq)
        .limit(size)
    )
    return conn.execute(query).all()


def attributes(conn: Connection, selection: Selection, first: int, last: int) -> dict[str, str]:
    """The attributes of the selected events with ``first <= seq <= last``, as JSON objects."""
    attr = outbox_event_attribute
    query = (
        select(attr.c.event_id, attr.c.attribute_key, attr.c.attribute_value)
        .join(outbox_event, outbox_event.c.event_id == attr.c.event_id)
        .where(*selection.where(), outbox_event.c.seq.between(first, last))
    )
    grouped: dict[str, dict[str, str | None]] = defaultdict(dict)
    for event_id, key, value in conn.execute(query):
        grouped[event_id][key] = value
    return {
        event_id: json.dumps(values, sort_keys=True, ensure_ascii=False)
        for event_id, values in grouped.items()
    }


def delete_chunk(
    engine: Engine, selection: Selection, after: int, size: int
) -> ChunkOutcome | None:
    """Delete mode: read only what the deletion and its announcement need."""
    columns = [outbox_event.c.seq, outbox_event.c.logged_at]
    with engine.connect() as conn:
        rows = select_rows(conn, selection, after, size, columns)
    if not rows:
        return None
    return finish_chunk(engine, [r.seq for r in rows], [r.logged_at for r in rows], archived=0)


def finish_chunk(
    engine: Engine, seqs: list[int], logged_at: list[datetime], *, archived: int
) -> ChunkOutcome:
    """Delete the chunk's rows (:func:`delete_rows`) and say what the chunk did."""
    deleted = delete_rows(engine, seqs)
    outcome = ChunkOutcome(
        last_seq=seqs[-1],
        read=len(seqs),
        archived=archived,
        deleted=deleted,
        first_logged_at=as_utc(min(logged_at)),
        last_logged_at=as_utc(max(logged_at)),
    )
    fields = {"seq_from": seqs[0], "seq_to": seqs[-1], "archived": archived, "deleted": deleted}
    if deleted != len(seqs):
        log.warning("housekeeping deleted fewer rows than it read: they changed", extra=fields)
    log.info("housekeeping chunk done", extra=fields)
    return outcome


def delete_rows(engine: Engine, seqs: Sequence[int]) -> int:
    """Delete exactly these rows, if still PUBLISHED, attributes first, in one transaction.

    One statement per row, sent with executemany: a ``seq = ?`` lookup always takes the
    primary key, where a long ``seq IN (...)`` made SQLite scan the status index instead.
    The attributes go explicitly: SQLite enforces the foreign key's cascade only when
    ``PRAGMA foreign_keys`` is on, which tidings does not require.
    """
    params = [{"b_seq": seq} for seq in seqs]
    with engine.begin() as conn:
        conn.execute(_DELETE_ATTRIBUTES, params)
        return conn.execute(_DELETE_EVENT, params).rowcount
