"""The event log as a Spark data source (``tidings_outbox``).

Streaming: the offset is the log sequence with a carry-over counter,
``{"seq": n, "carry": c}``; a micro-batch reads ``start < seq <= end`` where ``end`` never
passes the safe watermark (:mod:`tidings.pipeline.source.watermark`), so a restart from the
checkpoint resumes without loss or skip. Rows are split into partitions by
``partition_bucket`` so that every event of a key is read, in ``seq`` order, by the same
task.

Carry-over: while events at or below the offset are still open (HELD behind a waiting
event, waiting for a retry or for a target that was down), the reader bumps ``carry`` and
that micro-batch also reads them, before the new rows of the same buckets. FAILED events
are carried too (the publisher sends nothing more to where they failed past their last try,
but their other targets and the later events of their keys at other targets go on). So the
running relay resumes held keys itself, in key order, as soon as their targets take events
again: no scheduled replay is needed for that. Carry-overs come quickly while they make
progress and back off (up to a few seconds) while nothing moves; a batch needs no new rows
to carry.

Batch (``mode=replay``): the open rows (PENDING, HELD, FAILED) older than a threshold, up to
an event-number limit taken in log order, again partitioned by key bucket. A key whose
FAILED event is past the retry-count threshold is left out as a whole (it cannot move until
an operator acts), so its held events never eat the limit of the keys that can.

Warm-up (option ``warm_up``, a standby relay's, :mod:`tidings.pipeline.warmup`): every
trigger plans one slice that reads nothing (``{"seq": 0, "carry": n}``, no database), and its
task loads what a relay task loads and publishes nothing.

A task is handed its slice (:class:`LogSlice`) and publishes it where it runs
(:func:`tidings.pipeline.source.task.publish_task`): it reads the slice's rows itself and
yields one row, its :class:`~tidings.pipeline.publishing.outcome.Summary`. The events never
leave the task's Python worker, and a batch needs no second worker per task to write them nor one to
commit them: the job's driver collects the summaries and records the batch
(:mod:`tidings.pipeline.relay`, :mod:`tidings.pipeline.replay`). This module loads nothing
but PySpark's data source API: the queries and the publisher are loaded only where they run
(the streaming source runner, the replay's planning, the tasks).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, cast

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

from tidings.pipeline.source.runner_exit import quiet_when_the_jvm_closes
from tidings.pipeline.source.slices import SCHEMA, LogSlice

if TYPE_CHECKING:
    import pyarrow as pa

    from tidings.pipeline.source.queries import LogReader

#: A streaming offset: ``{"seq": n, "carry": c}`` (see the module's docstring).
Offset = dict[str, int]
#: The option that makes a stream a standby's warm-up (see the module's docstring).
WARM_UP_OPTION = "warm_up"
_EVENTS_PER_TASK = 5_000
_SETTLE_SECONDS = 60.0  # availableNow: how long to wait for in-flight writers to finish
_CARRY_FIRST_S = 0.5  # pause between carry-overs while they make progress
_CARRY_MAX_S = 3.0  # ... doubling up to this while nothing moves


class _LogUser:
    """Opens the event log on first use (see the module's docstring)."""

    options: dict[str, str]
    _log: LogReader | None = None

    @property
    def log(self) -> LogReader:
        if self._log is None:
            from tidings.pipeline.source.queries import LogReader

            self._log = LogReader(self.options)
        return self._log


class OutboxDataSource(DataSource):
    """``spark.readStream.format("tidings_outbox")`` / ``spark.read.format(...)``."""

    @classmethod
    def name(cls) -> str:
        return "tidings_outbox"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: object) -> OutboxStreamReader:
        # Called in Spark's streaming source runner: a stopped query ends it quietly.
        quiet_when_the_jvm_closes()
        return OutboxStreamReader(self.options)

    def reader(self, schema: object) -> ReplayReader:
        return ReplayReader(self.options)


class OutboxStreamReader(_LogUser, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the log sequence."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        self._until: int | None = None
        self._next_carry = 0.0
        self._carry_pause = _CARRY_FIRST_S
        self._open_below: int | None = None  # open rows at or below the offset, last count
        self._carried_once = False
        self._warm_up = self.options.get(WARM_UP_OPTION) == "true"

    def initialOffset(self) -> Offset:
        if self._warm_up:
            return {"seq": 0, "carry": 0}
        return {"seq": self.log.start(), "carry": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.log.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self.log.settle(_SETTLE_SECONDS)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        if self._warm_up:  # a batch every trigger, reading nothing
            return {"seq": 0, "carry": int(start.get("carry", 0)) + 1}
        from tidings.pipeline.standby import check_fence

        # A relay that lost its lease plans no batch: it writes no offsets to the checkpoint.
        check_fence(self.log.engine, self.options)
        after, carry = int(start["seq"]), int(start.get("carry", 0))
        carried = self._carry_due(after)
        max_rows = self.log.max_rows
        upto = self.log.safe_upto() if self._until is None else self._until
        if carried and (self._open_below or 0) > max_rows:
            # Cut short, a carry-over could leave a key's later open events out while its new
            # ones came in: carry alone this time (the publisher relies on it).
            upto = after
        if carried:
            carry += 1
        if upto <= after:
            return {"seq": after, "carry": carry} if carried else start
        if not isinstance(limit, ReadAllAvailable):
            rows = limit.max_rows if isinstance(limit, ReadMaxRows) else max_rows
            nth = self.log.nth_seq(after, upto, rows)
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
        count = self.log.open_count(after)
        progress = self._open_below is None or count < self._open_below
        self._carry_pause = _CARRY_FIRST_S if progress else min(2 * self._carry_pause, _CARRY_MAX_S)
        self._next_carry = now + self._carry_pause
        self._open_below = count
        self._carried_once = self._carried_once or count > 0
        return count > 0

    def partitions(self, start: Offset, end: Offset) -> list[LogSlice]:
        after, upto = int(start["seq"]), int(end["seq"])
        carry = int(end.get("carry", 0)) != int(start.get("carry", 0))
        if self._warm_up:
            return [LogSlice(0, 0, 0, 1)]
        if upto <= after and not carry:
            return []
        rows = (upto - after) + ((self._open_below or 0) if carry else 0)
        # A small batch is cheaper as one task: each task costs a Python worker round trip.
        n = max(1, min(self.log.partition_count, rows // _EVENTS_PER_TASK))
        if not carry:
            return [LogSlice(after, upto, i, n) for i in range(n)]
        limit = self.log.max_rows
        return [LogSlice(after, upto, i, n, carry_upto=after, carry_limit=limit) for i in range(n)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield _published(self.options, cast(LogSlice, partition))

    def commit(self, end: Offset) -> None:
        """Nothing to release: progress is kept by Spark's checkpoint and the batch log."""


class ReplayReader(_LogUser, DataSourceReader):
    """The open events a replay run re-publishes."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        older_than = float(self.options.get("older_than_s", "0"))
        self.open_before = time.time() - older_than
        self.event_limit = int(self.options.get("event_limit", "0")) or None
        self.stuck_at = int(self.options.get("retry_threshold") or 0) or None

    def partitions(self) -> list[LogSlice]:
        return self.log.replay_slices(self.open_before, self.stuck_at, self.event_limit)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield _published(self.options, cast(LogSlice, partition))


def _published(options: Mapping[str, str], part: LogSlice) -> pa.RecordBatch:
    """Publish ``part`` in this task (loading the publisher here, where it runs); in a
    warm-up, load it and publish nothing."""
    if options.get(WARM_UP_OPTION) == "true":
        from tidings.pipeline.source.task import warm_up_task

        return warm_up_task(options)
    from tidings.pipeline.source.task import publish_task

    return publish_task(options, part)
