"""The event log as a Spark data source (``tidings_outbox``).

Streaming: the offset is the log sequence with a carry-over counter,
``{"seq": n, "carry": c}``; a micro-batch reads ``start < seq <= end`` where ``end`` never
passes the safe watermark (:mod:`tidings.pipeline.watermark`), so a restart from the
checkpoint resumes without loss or skip. Rows are split into partitions by
``partition_bucket`` so that every event of a key is read, in ``seq`` order, by the same
task.

Carry-over: while events at or below the offset are still open (HELD behind a waiting
event, waiting for a retry or for a target that was down), the reader bumps ``carry`` and
that micro-batch also reads them, before the new rows of the same buckets. FAILED events
are carried too (the publisher sends nothing more to where they failed past their last try,
but their other targets and the later events of their keys at other targets go on). So the running
relay resumes held keys itself, in key order, as soon as their targets take events again:
no scheduled replay is needed for that. Carry-overs come quickly while they make progress
and back off (up to a few seconds) while nothing moves; a batch needs no new rows to carry.

Batch (``mode=replay``): the open rows (PENDING, HELD, FAILED) older than a threshold, up to
an event-number limit taken in log order, again partitioned by key bucket. A key whose
FAILED event is past the retry-count threshold is left out as a whole (it cannot move until
an operator acts), so its held events never eat the limit of the keys that can.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from sqlalchemy import Engine, Select, func, select, text
from sqlalchemy.sql.elements import ColumnElement, TextClause

from tidings.db import shared_engine
from tidings.events.outbox import OPEN_STATUSES, EventStatus
from tidings.events.timeutil import utcnow
from tidings.outbox.schema import (
    OPEN_ROW,
    OUTBOX_EVENT_COLUMNS,
    batch_log,
    ensure_schema,
    outbox_event,
    outbox_event_from_row,
)
from tidings.pipeline.jobconfig import started_config
from tidings.pipeline.outcome import LoggedEvent
from tidings.pipeline.watermark import SafeWatermark

#: What the source hands the sink: one row per task, the slice of the log (JSON) it is to
#: publish. The sink's task reads the rows itself (:func:`read_slice`), so the events do not
#: travel from one Python worker through the JVM to another.
SCHEMA = "slice string"
#: What a slice reads of each row: the event, then its publication state.
_READ = (*OUTBOX_EVENT_COLUMNS, "status", "retry_count", "deliveries")
_STATUS = {status.value: status for status in EventStatus}  # cheaper than EventStatus(text)
_COLUMNS = [outbox_event.c[name] for name in _READ]
#: Events a task publishes in one run (its memory bound, and its writes' size).
CHUNK = 20_000
_FETCH_STEP = 1_000
_CHUNK_BYTES = 64 * 1024 * 1024
_EVENTS_PER_TASK = 5_000
_SETTLE_SECONDS = 60.0  # availableNow: how long to wait for in-flight writers to finish
_CARRY_FIRST_S = 0.5  # pause between carry-overs while they make progress
_CARRY_MAX_S = 3.0  # ... doubling up to this while nothing moves
_OPEN = sorted(s.value for s in OPEN_STATUSES)


@dataclass(frozen=True)
class LogSlice(InputPartition):
    """Rows with ``after < seq <= upto`` whose bucket falls to this partition."""

    after: int
    upto: int
    index: int
    count: int
    open_before: float | None = None  # replay: only open rows logged before this epoch time
    stuck_at: int | None = None  # replay: leave out keys with a FAILED event retried this often
    carry_upto: int | None = None  # carry-over: first the open rows with seq <= this
    carry_limit: int = 0  # ... at most this many of them, oldest first

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LogSlice:
        return cls(**json.loads(text))


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

    A chunk is what the sink publishes in one run: bounded (in rows and payload bytes), so
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
    """The rows of ``query`` as logged events, fetched in steps, cut into chunks."""
    with engine.connect() as conn:
        result = conn.execution_options(yield_per=_FETCH_STEP).execute(query)
        chunk: list[LoggedEvent] = []
        size = 0
        for rows in result.partitions(_FETCH_STEP):
            for row in rows:
                chunk.append(_logged(*row))
                size += len(row.payload)
                if len(chunk) >= limit or size >= _CHUNK_BYTES:
                    yield chunk
                    chunk, size = [], 0
        if chunk:
            yield chunk


def _logged(*values: Any) -> LoggedEvent:
    """One row of :data:`_READ` as a logged event."""
    status, retries, deliveries = values[-3:]
    return LoggedEvent(
        event=outbox_event_from_row(*values[:-3]),
        status=_STATUS[status],
        retry_count=retries or 0,
        deliveries=json.loads(deliveries) if deliveries else {},
    )


def _epoch_to_datetime(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


class OutboxDataSource(DataSource):
    """``spark.readStream.format("tidings_outbox")`` / ``spark.read.format(...)``."""

    @classmethod
    def name(cls) -> str:
        return "tidings_outbox"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: object) -> OutboxStreamReader:
        return OutboxStreamReader(self.options)

    def reader(self, schema: object) -> ReplayReader:
        return ReplayReader(self.options)


class OutboxStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the log sequence."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        config = started_config(self.options)
        self.url = config.database.url
        self.partition_count = config.relay.partitions
        self.max_rows = config.relay.max_events_per_batch
        self._watermark: SafeWatermark | None = None
        self._until: int | None = None
        self._next_carry = 0.0
        self._carry_pause = _CARRY_FIRST_S
        self._open_below: int | None = None  # open rows at or below the offset, last count
        self._carried_once = False

    @property
    def engine(self) -> Engine:
        return shared_engine(self.url)

    def _mark(self) -> SafeWatermark:
        if self._watermark is None:
            ensure_schema(self.engine)
            self._watermark = SafeWatermark(self.engine)
        return self._watermark

    def initialOffset(self) -> dict:
        ensure_schema(self.engine)
        return {"seq": relay_watermark(self.engine) or 0, "carry": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._mark().settle(_SETTLE_SECONDS)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        after, carry = int(start["seq"]), int(start.get("carry", 0))
        carried = self._carry_due(after)
        upto = self._mark()() if self._until is None else self._until
        if carried and (self._open_below or 0) > self.max_rows:
            # Cut short, a carry-over could leave a key's later open events out while its new
            # ones came in: carry alone this time (the publisher relies on it).
            upto = after
        if carried:
            carry += 1
        if upto <= after:
            return {"seq": after, "carry": carry} if carried else start
        if not isinstance(limit, ReadAllAvailable):
            rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_rows
            query = (
                select(outbox_event.c.seq)
                .where(outbox_event.c.seq > after, outbox_event.c.seq <= upto)
                .order_by(outbox_event.c.seq)
                .offset(rows - 1)
                .limit(1)
            )
            with self.engine.connect() as conn:
                nth = conn.execute(query).scalar()
            if nth is not None:
                upto = nth
        return {"seq": upto, "carry": carry}

    def _carry_due(self, after: int) -> bool:
        """Should the next batch carry over the open events at or below ``after``?

        Quickly again while the open count falls, backing off while it does not; under
        availableNow (``relay --once``) at most once.
        """
        now = time.monotonic()
        if now < self._next_carry or (self._until is not None and self._carried_once):
            return False
        query = select(func.count()).where(outbox_event.c.status.in_(_OPEN))
        with self.engine.connect() as conn:
            count = conn.execute(query.where(outbox_event.c.seq <= after)).scalar() or 0
        progress = self._open_below is None or count < self._open_below
        self._carry_pause = _CARRY_FIRST_S if progress else min(2 * self._carry_pause, _CARRY_MAX_S)
        self._next_carry = now + self._carry_pause
        self._open_below = count
        self._carried_once = self._carried_once or count > 0
        return count > 0

    def partitions(self, start: dict, end: dict) -> list[LogSlice]:
        after, upto = int(start["seq"]), int(end["seq"])
        carry = int(end.get("carry", 0)) != int(start.get("carry", 0))
        if upto <= after and not carry:
            return []
        rows = (upto - after) + ((self._open_below or 0) if carry else 0)
        # A small batch is cheaper as one task: each task costs a Python worker round trip.
        n = max(1, min(self.partition_count, rows // _EVENTS_PER_TASK))
        if not carry:
            return [LogSlice(after, upto, i, n) for i in range(n)]
        limit = self.max_rows
        return [LogSlice(after, upto, i, n, carry_upto=after, carry_limit=limit) for i in range(n)]

    def read(self, partition: LogSlice) -> Iterator[tuple[str]]:
        yield (partition.to_json(),)

    def commit(self, end: dict) -> None:
        """Nothing to release: progress is kept by Spark's checkpoint and the batch log."""


class ReplayReader(DataSourceReader):
    """The open events a replay run re-publishes."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        config = started_config(self.options)
        self.url = config.database.url
        self.partition_count = config.relay.partitions
        older_than = timedelta(seconds=float(self.options.get("older_than_s", "0")))
        self.open_before = (utcnow() - older_than).timestamp()
        self.event_limit = int(self.options.get("event_limit", "0")) or None
        self.stuck_at = int(self.options.get("retry_threshold") or 0) or None

    def partitions(self) -> list[LogSlice]:
        engine = shared_engine(self.url)
        ensure_schema(engine)
        upto = relay_watermark(engine)
        if upto is None:  # no relay batch yet: every row is still the relay's to deliver
            return [LogSlice(0, 0, 0, 1)]  # reads nothing (Spark wants one partition)
        cutoff = _epoch_to_datetime(self.open_before)
        base = select(outbox_event.c.seq).where(
            outbox_event.c.status.in_(_OPEN),
            outbox_event.c.logged_at < cutoff,
            outbox_event.c.seq <= upto,
        )
        if self.stuck_at is not None:
            base = base.where(not_stuck(self.stuck_at))
        if self.event_limit is not None:
            with engine.connect() as conn:
                nth = conn.execute(
                    base.order_by(outbox_event.c.seq).offset(self.event_limit - 1).limit(1)
                ).scalar()
            upto = nth if nth is not None else upto
        n = self.partition_count
        return [LogSlice(0, upto, i, n, self.open_before, self.stuck_at) for i in range(n)]

    def read(self, partition: LogSlice) -> Iterator[tuple[str]]:
        yield (partition.to_json(),)
