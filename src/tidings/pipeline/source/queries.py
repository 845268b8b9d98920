"""Reading the event log for the relay and the replay: the queries behind the data source.

Apart from the Spark-facing classes (:mod:`tidings.pipeline.source.datasource`) so that the Spark
workers that only plan a job never load SQLAlchemy, the configuration models or the
publisher: each such worker is a process of its own, and what it imports is its memory and
its start-up time. The long-lived streaming source runner and the tasks that publish use
this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, Select, func, select, text
from sqlalchemy.sql.elements import ColumnElement, TextClause

from tidings.db import shared_engine
from tidings.events.outbox import OPEN_STATUSES, EventStatus, OutboxEvent
from tidings.outbox.schema import (
    OPEN_ROW,
    OUTBOX_EVENT_COLUMNS,
    batch_log,
    ensure_schema,
    outbox_event,
)
from tidings.pipeline.publishing.outcome import LoggedEvent
from tidings.pipeline.source.slices import LogSlice
from tidings.pipeline.source.watermark import SafeWatermark

#: What a slice reads of each row: the event, then its publication state (:func:`_chunks`
#: unpacks them in this order).
_READ = (*OUTBOX_EVENT_COLUMNS, "status", "retry_count", "deliveries")
_STATUS = {status.value: status for status in EventStatus}  # cheaper than EventStatus(text)
_COLUMNS = [outbox_event.c[name] for name in _READ]
#: Events a task publishes in one run (its memory bound, and its writes' size).
CHUNK = 20_000
_FETCH_STEP = 1_000
_CHUNK_BYTES = 64 * 1024 * 1024
_OPEN = sorted(s.value for s in OPEN_STATUSES)


class LogReader:
    """The event log a job reads: its database, its safe watermark, the relay's settings."""

    def __init__(self, options: Mapping[str, str]) -> None:
        """``options`` are the job's (:func:`tidings.pipeline.jobconfig.job_options`): the
        plain values it needs, not the configuration, whose models it never loads."""
        self.url = options["database_url"]
        self.partition_count = int(options["partitions"])
        self.max_rows = int(options["max_events_per_batch"])
        self._watermark: SafeWatermark | None = None

    @property
    def engine(self) -> Engine:
        return shared_engine(self.url)

    def start(self) -> int:
        """Where a relay without a checkpoint starts: after the last batch it recorded."""
        ensure_schema(self.engine)
        return relay_watermark(self.engine) or 0

    def safe_upto(self) -> int:
        """The highest seq that may be read now without ever skipping a row."""
        return self._mark()()

    def settle(self, seconds: float) -> int:
        """The safe watermark once in-flight writers finished (up to ``seconds``)."""
        return self._mark().settle(seconds)

    def nth_seq(self, after: int, upto: int, rows: int) -> int | None:
        """The ``rows``-th seq after ``after`` (up to ``upto``); None if there are fewer."""
        query = (
            select(outbox_event.c.seq)
            .where(outbox_event.c.seq > after, outbox_event.c.seq <= upto)
            .order_by(outbox_event.c.seq)
            .offset(rows - 1)
            .limit(1)
        )
        with self.engine.connect() as conn:
            return conn.execute(query).scalar()

    def open_count(self, upto: int) -> int:
        """How many events at or below ``upto`` are still open."""
        query = select(func.count()).where(
            outbox_event.c.status.in_(_OPEN), outbox_event.c.seq <= upto
        )
        with self.engine.connect() as conn:
            return conn.execute(query).scalar() or 0

    def replay_slices(
        self, open_before: float, stuck_at: int | None, event_limit: int | None
    ) -> list[LogSlice]:
        """A replay's slices: open rows logged before ``open_before``, up to the relay's
        watermark and ``event_limit`` events, keys stuck at ``stuck_at`` left out."""
        engine = self.engine
        ensure_schema(engine)
        upto = relay_watermark(engine)
        if upto is None:  # no relay batch yet: every row is still the relay's to deliver
            return [LogSlice(0, 0, 0, 1)]  # reads nothing (Spark wants one partition)
        base = select(outbox_event.c.seq).where(
            outbox_event.c.status.in_(_OPEN),
            outbox_event.c.logged_at < _epoch_to_datetime(open_before),
            outbox_event.c.seq <= upto,
        )
        if stuck_at is not None:
            base = base.where(not_stuck(stuck_at))
        if event_limit is not None:
            with engine.connect() as conn:
                nth = conn.execute(
                    base.order_by(outbox_event.c.seq).offset(event_limit - 1).limit(1)
                ).scalar()
            upto = nth if nth is not None else upto
        n = self.partition_count
        return [LogSlice(0, upto, i, n, open_before, stuck_at) for i in range(n)]

    def _mark(self) -> SafeWatermark:
        if self._watermark is None:
            ensure_schema(self.engine)
            self._watermark = SafeWatermark(self.engine)
        return self._watermark


def relay_watermark(engine: Engine, job: str = "relay") -> int | None:
    """The highest seq a finished relay batch has handled (None if none ran yet)."""
    with engine.connect() as conn:
        return conn.execute(
            select(func.max(batch_log.c.max_seq)).where(batch_log.c.job == job)
        ).scalar()


def read_slice(
    engine: Engine, part: LogSlice, *, chunk: int = CHUNK
) -> Iterator[list[LoggedEvent]]:
    """Stream one slice of the log in seq order, in chunks of logged events.

    A chunk is what a task publishes in one run: bounded (in rows and payload bytes), so
    a task's memory does not grow with ``max_events_per_batch``, and the task's writes come
    as short transactions that interleave with the other tasks' (SQLite has one writer).
    """
    bucket: list[ColumnElement[bool]] = []
    if part.count > 1:
        bucket.append(outbox_event.c.partition_bucket % part.count == part.index)
    if part.carry_upto is not None:
        carried = (
            select(*_COLUMNS)
            .where(outbox_event.c.status.in_(_OPEN), outbox_event.c.seq <= part.carry_upto)
            .where(*bucket)
            .order_by(outbox_event.c.seq)
            .limit(part.carry_limit)
        )
        yield from _chunks(engine, carried, chunk)
    where: list[ColumnElement[bool] | TextClause] = [
        outbox_event.c.seq > part.after,
        outbox_event.c.seq <= part.upto,
        *bucket,
    ]
    if part.open_before is not None:
        where.append(outbox_event.c.status.in_(_OPEN))
        where.append(outbox_event.c.logged_at < _epoch_to_datetime(part.open_before))
    if part.stuck_at is not None:
        where.append(not_stuck(part.stuck_at))
    yield from _chunks(engine, select(*_COLUMNS).where(*where).order_by(outbox_event.c.seq), chunk)


def not_stuck(threshold: int) -> TextClause:
    """Neither the row nor an earlier event of its key is FAILED with ``threshold`` retries
    or more.

    Such an event waits for an operator (resubmit or park), and so does every later open
    event of its key at the targets it failed at: a replay that took them would spend its
    event limit on rows it cannot move. The probe is spelled with literals, as the open-row
    index's condition is, so that SQLite's planner takes that partial index (key, seq)
    instead of scanning every FAILED row for each row (seconds per thousand rows).
    """

    def stuck(table: str) -> str:
        return f"{table}.status = 'FAILED' AND {table}.retry_count >= {int(threshold)}"

    return text(
        f"NOT ({stuck('outbox_event')}) AND NOT EXISTS (SELECT 1 FROM outbox_event AS stuck "
        "WHERE stuck.partition_key = outbox_event.partition_key "
        f"AND stuck.seq < outbox_event.seq AND stuck.{OPEN_ROW.text} AND {stuck('stuck')})"
    )


def _chunks(engine: Engine, query: Select[Any], limit: int) -> Iterator[list[LoggedEvent]]:
    """The rows of ``query`` as logged events, fetched in steps, cut into chunks.

    The rows are unpacked in place (the :data:`_READ` order) rather than through
    :func:`~tidings.outbox.schema.outbox_event_from_row`: this loop runs once per relayed
    event, and the call, the slices and the look-ups by name were a fifth of it.
    """
    with engine.connect() as conn:
        chunk: list[LoggedEvent] = []
        size = 0
        statuses, loads, utc, parse = _STATUS, json.loads, UTC, datetime.fromisoformat
        for rows in _fetched(conn, query):
            for (
                seq,
                event_id,
                event_type,
                version,
                correlation_id,
                originator,
                key,
                payload,
                headers,
                logged_at,
                status,
                retries,
                deliveries,
            ) in rows:
                if logged_at.__class__ is str:  # SQLite's text, as SQLAlchemy stores it
                    logged_at = parse(logged_at)
                event = OutboxEvent(
                    seq,
                    event_id,
                    event_type,
                    payload,
                    # as_utc, inlined: naive from SQLite, aware elsewhere
                    logged_at.replace(tzinfo=utc)
                    if logged_at.tzinfo is None
                    else logged_at.astimezone(utc),
                    version,
                    correlation_id,
                    originator,
                    key,
                    loads(headers) if headers and headers != "{}" else {},
                )
                chunk.append(
                    LoggedEvent(
                        event,
                        statuses[status],
                        retries or 0,
                        loads(deliveries) if deliveries else {},
                    )
                )
                size += len(payload)
                if len(chunk) >= limit or size >= _CHUNK_BYTES:
                    yield chunk
                    chunk, size = [], 0
        if chunk:
            yield chunk


def _fetched(conn: Connection, query: Select[Any]) -> Iterator[Sequence[Any]]:
    """The rows of ``query`` in steps of :data:`_FETCH_STEP`, in :data:`_READ` order.

    On SQLite straight from the driver's cursor, as plain tuples (``logged_at`` as the text
    SQLAlchemy stored): the driver steps through the result as it is fetched, and
    SQLAlchemy's rows and their conversions were a tenth of a relay's reading. Elsewhere
    through SQLAlchemy, which streams the rows (a server-side cursor on PostgreSQL).
    """
    if conn.dialect.name == "sqlite":
        cursor = conn.execute(query).cursor
        while rows := cursor.fetchmany(_FETCH_STEP):
            yield rows
        return
    yield from conn.execution_options(yield_per=_FETCH_STEP).execute(query).partitions(_FETCH_STEP)


def _epoch_to_datetime(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)
