"""What the event log says about the confirmations at one target: when the newest one was
made, and which events were confirmed shortly before it.

The ``event_server`` target sends again, on a new connection, the events its group's lost
server confirmed in its last moments and may not have synced to its peers
(:mod:`tidings.targets.kinds.resend_window`). A target instance remembers only what its own
Python process confirmed; the log remembers what every relay task confirmed, in every Spark
worker and every relay process before this one (``deliveries`` holds, per target, the state
and the time of its confirmation). Read from here, the re-send covers them all.

The window is taken back from the newest confirmation at the target, its *mark*, not from
now: the server that confirmed last was alive then, so the events it may have left unsynced
at its death were confirmed at most ``seconds`` before the mark, however long ago the death
was (a standby relay starts publishing tens of seconds after the active relay and its server
died together). Every ``record_outcomes`` raises the mark (:func:`raise_marks`), one upsert
per target in the same transaction.

Reading takes three indexed reads, cheap on a log of any size: the mark by its key; the
rows changed since the window's start, through the ``(status, updated_at)`` index
(``updated_at`` is written with each delivery state, so a row confirmed within the window
was changed within it), keeping those whose delivery to the target was confirmed within the
window; then the chosen rows by ``seq``. The design notes (docs/design/redundancy.md) show
the second one's plans.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.dialects import mysql, postgresql, sqlite

from tidings.db import driver_stamp, is_mysql, placeholder
from tidings.events.outbox import DeliveryState, EventStatus, OutboxEvent
from tidings.events.timeutil import as_utc, utcnow
from tidings.outbox.schema import (
    OUTBOX_EVENT_COLUMNS,
    outbox_event,
    outbox_event_from_row,
    target_mark,
)

#: Statuses a row confirmed at some target can have: all but UNROUTABLE (never sent).
_SENT = tuple(s.value for s in EventStatus if s != EventStatus.UNROUTABLE)
_STATUS_IN = "o.status IN ({})".format(", ".join(f"'{s}'" for s in _SENT))
_CONFIRMED = DeliveryState.CONFIRMED.value
#: Bytes counted per event beyond its payload and type (ids, timestamps, framing).
EVENT_OVERHEAD = 64
_T = TypeVar("_T")


def newest_within(
    newest_first: Iterable[_T], weight: Callable[[_T], int], max_events: int, max_bytes: int
) -> list[_T]:
    """The leading entries of ``newest_first`` (newest first) up to ``max_events`` of them
    and about ``max_bytes`` of ``weight`` (at least one), oldest first."""
    kept: list[_T] = []
    size = 0
    for entry in newest_first:
        size += weight(entry)
        if len(kept) == max_events or (size > max_bytes and kept):
            break
        kept.append(entry)
    kept.reverse()
    return kept


def raise_marks(conn: Connection, confirmed: Mapping[str, datetime]) -> None:
    """Raise each target's mark to its time in ``confirmed`` (a mark is never lowered: a
    task recording late writes an older time). Targets in name order, so that concurrent
    transactions lock the mark rows in one order."""
    if not confirmed:
        return
    rows = [{"target": name, "confirmed_at": confirmed[name]} for name in sorted(confirmed)]
    if conn.dialect.name == "postgresql":
        pg = postgresql.insert(target_mark)
        newest = func.greatest(target_mark.c.confirmed_at, pg.excluded.confirmed_at)
        conn.execute(
            pg.on_conflict_do_update(index_elements=["target"], set_={"confirmed_at": newest}), rows
        )
        return
    if is_mysql(conn.dialect.name):
        my = mysql.insert(target_mark)
        newest = func.greatest(target_mark.c.confirmed_at, my.inserted.confirmed_at)
        conn.execute(my.on_duplicate_key_update(confirmed_at=newest), rows)
        return
    lite = sqlite.insert(target_mark)
    newest = func.max(target_mark.c.confirmed_at, lite.excluded.confirmed_at)
    conn.execute(
        lite.on_conflict_do_update(index_elements=["target"], set_={"confirmed_at": newest}), rows
    )


def newest_confirmations(
    deliveries: Iterable[Iterable[tuple[str, Mapping[str, Any]]]],
) -> dict[str, datetime]:
    """Per target, the newest confirmation among ``deliveries`` (each one event's
    ``(target, state)`` pairs). A time that does not parse is left out: a mark is a help
    to the re-send, and must never keep an outcome from being recorded."""
    stamps: dict[str, set[str]] = {}
    for states in deliveries:
        for name, state in states:
            if state.get("state") == _CONFIRMED and isinstance(at := state.get("at"), str):
                stamps.setdefault(name, set()).add(at)
    newest = {}
    for name, found in stamps.items():
        times = [time for time in map(_parsed, found) if time is not None]
        if times:
            newest[name] = max(times)
    return newest


def _parsed(stamp: str) -> datetime | None:
    try:
        return as_utc(datetime.fromisoformat(stamp))
    except ValueError:
        return None


class ConfirmationLog:
    """The confirmations an outbox log records, as the ``event_server`` target reads them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def mark(self, target: str) -> datetime | None:
        """When the newest confirmation recorded at ``target`` was made (None: none yet)."""
        with self.engine.connect() as conn:
            found = conn.execute(
                select(target_mark.c.confirmed_at).where(target_mark.c.target == target)
            ).scalar_one_or_none()
        return None if found is None else as_utc(found)

    def recent(
        self, target: str, seconds: float, max_events: int, max_bytes: int
    ) -> list[OutboxEvent]:
        """The events confirmed at ``target`` at most ``seconds`` before its mark (or before
        now, if it has none or the mark is ahead of this host's clock), in log order: the
        newest ``max_events`` of them, fewer if their payloads pass ``max_bytes``."""
        if seconds <= 0:
            return []
        now = utcnow()
        mark = self.mark(target)
        since = min(now if mark is None else mark, now) - timedelta(seconds=seconds)
        found = sorted(self._confirmed_since(target, since), reverse=True)
        chosen = [seq for seq, _ in newest_within(found, lambda e: e[1], max_events, max_bytes)]
        if not chosen:
            return []
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(*(outbox_event.c[name] for name in OUTBOX_EVENT_COLUMNS))
                .where(outbox_event.c.seq.in_(chosen))
                .order_by(outbox_event.c.seq)
            )
            return [outbox_event_from_row(*row) for row in rows]

    def _confirmed_since(self, target: str, since: datetime) -> list[tuple[int, int]]:
        """``(seq, weight)`` of the rows confirmed at ``target`` at or after ``since``."""
        sql, params = confirmed_query(self.engine, target, since)
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql(sql, params).all()
        return [
            (seq, weight)
            for seq, at, weight in rows
            if isinstance(at, str) and (time := _parsed(at)) is not None and time >= since
        ]


def confirmed_query(engine: Engine, target: str, since: datetime) -> tuple[str, tuple[Any, ...]]:
    """The statement (and its parameters) that finds the rows changed since ``since`` whose
    delivery to ``target`` is confirmed: ``(seq, confirmed at, weight)``, in no order."""
    dialect = engine.dialect.name
    p = placeholder(engine.dialect.paramstyle)
    weight = f"length(o.payload) + length(o.event_type) + {EVENT_OVERHEAD}"
    if dialect == "sqlite":
        # CROSS JOIN keeps the loop order: the log's rows through the index, then each row's
        # own deliveries (json_each(NULL) has none).
        sql = (
            f"SELECT o.seq, json_extract(d.value, '$.at'), {weight} "
            "FROM outbox_event AS o CROSS JOIN json_each(o.deliveries) AS d "
            f"WHERE {_STATUS_IN} AND o.updated_at >= {p} AND d.key = {p} "
            f"AND json_extract(d.value, '$.state') = '{_CONFIRMED}'"
        )
        return sql, (driver_stamp(dialect)(since), target)
    if is_mysql(dialect):
        # JSON_VALUE with a path naming the target as a quoted member (any name is one).
        sql = (
            f"SELECT o.seq, JSON_VALUE(o.deliveries, {p}), {weight} FROM outbox_event AS o "
            f"WHERE {_STATUS_IN} AND o.updated_at >= {p} "
            f"AND JSON_VALUE(o.deliveries, {p}) = '{_CONFIRMED}'"
        )
        member = "$." + json.dumps(target)
        return sql, (f"{member}.at", driver_stamp(dialect)(since), f"{member}.state")
    sql = (
        f"SELECT o.seq, o.deliveries::json -> {p} ->> 'at', {weight} FROM outbox_event AS o "
        f"WHERE {_STATUS_IN} AND o.updated_at >= {p} "
        f"AND o.deliveries::json -> {p} ->> 'state' = '{_CONFIRMED}'"
    )
    return sql, (target, since, target)
