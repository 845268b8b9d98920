"""The housekeeping job (design doc: House keeping): archive and delete published events.

Only PUBLISHED rows go. PENDING, HELD and FAILED rows still owe a delivery; UNROUTABLE
rows were never delivered anywhere and stay for inspection. Nothing of the current UTC day
is touched ("don't delete current day"), whatever ``older_than`` says, so today's events
are always there for support queries.

The rows are handled in chunks in log (``seq``) order, so a million of them never sit in
memory at once. In ``archive`` mode a chunk is written to Parquet through Spark,
partitioned by ``day`` (of ``logged_at``, UTC) and ``event_type``, into a staging directory
of its own (``_staging/chunk-<first seq>-<last seq>``, which readers of the archive skip
like every ``_`` path); only after that write succeeded are exactly its rows deleted,
attributes first, in one transaction; then its files are moved into the archive. A run
first settles what a crashed one staged, by the database's word: a chunk whose rows are
still in the log was never deleted and is dropped (its rows are archived again), one whose
rows are gone is moved in. So the archive holds every deleted event exactly once, whatever
step a crash interrupted.
Readers of the archive should turn off Spark's partition type inference
(``spark.sql.sources.partitionColumnTypeInference.enabled=false``) if event types can look
like numbers.

A run that deleted anything says so with an ``OutboxDeletionCompleted`` event, emitted into
the log like any other so that routing delivers it. The run also trims the batch log.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from sqlalchemy import Column, Connection, Engine, Row, and_, bindparam, func, select
from sqlalchemy.sql.elements import ColumnElement

from tidings.config import TidingsConfig
from tidings.db import shared_engine
from tidings.errors import HousekeepingError, UsageError
from tidings.events.outbox import EventStatus
from tidings.events.timeutil import as_utc, utcnow
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import batch_log, ensure_schema, outbox_event, outbox_event_attribute
from tidings.pipeline.lease import new_owner, release, try_acquire
from tidings.pipeline.spark import spark_location

log = logging.getLogger(__name__)

DELETION_EVENT = "OutboxDeletionCompleted"
CHUNK_SIZE = 100_000
#: The lease that keeps two runs from settling each other's staged chunks.
LEASE = "housekeeping"
_LEASE_S = 30 * 60.0  # renewed before every chunk
#: Where a chunk is written before its rows are deleted (Spark and readers skip ``_`` paths).
STAGING_DIR = "_staging"
_CHECK_ROWS = 1_000  # a staged chunk's rows went in one transaction: a sample tells
_PUBLISHED = EventStatus.PUBLISHED.value
_ARROW_TYPES: dict[type, pa.DataType] = {
    int: pa.int64(),
    str: pa.string(),
    datetime: pa.timestamp("us", tz="UTC"),
}
#: Every column of ``outbox_event``, then the event's attributes as a JSON object and the
#: ``day`` partition column.
ARCHIVE_SCHEMA = pa.schema(
    [(c.name, _ARROW_TYPES[c.type.python_type]) for c in outbox_event.columns]
    + [("attributes", pa.string()), ("day", pa.string())]
)

_STILL_PUBLISHED = and_(
    outbox_event.c.seq == bindparam("b_seq"), outbox_event.c.status == _PUBLISHED
)
_DELETE_ATTRIBUTES = outbox_event_attribute.delete().where(
    outbox_event_attribute.c.event_id
    == select(outbox_event.c.event_id).where(_STILL_PUBLISHED).scalar_subquery()
)
_DELETE_EVENT = outbox_event.delete().where(_STILL_PUBLISHED)

Progress = Callable[[int, int], None]
ChunkStep = Callable[[int, int], "_ChunkOutcome | None"]


@dataclass(frozen=True)
class HousekeepingResult:
    """What one run did; ``archive_path`` is where archive mode writes, None in delete mode."""

    deleted: int
    archived: int
    archive_path: str | None
    first_logged_at: datetime | None
    last_logged_at: datetime | None
    mode: str
    batch_log_trimmed: int = 0


@dataclass(frozen=True)
class _Selection:
    """The rows that go: PUBLISHED, last changed before the cutoff, logged before today."""

    updated_before: datetime
    logged_before: datetime

    @classmethod
    def at(cls, now: datetime, older_than: timedelta) -> _Selection:
        today = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return cls(updated_before=min(now - older_than, today), logged_before=today)

    def where(self) -> list[ColumnElement[bool]]:
        return [
            outbox_event.c.status == _PUBLISHED,
            outbox_event.c.updated_at < self.updated_before,
            outbox_event.c.logged_at < self.logged_before,
        ]


@dataclass(frozen=True)
class _ChunkOutcome:
    """One chunk done: the rows read (and archived, in archive mode) and those deleted."""

    last_seq: int
    read: int
    archived: int
    deleted: int
    first_logged_at: datetime
    last_logged_at: datetime


@dataclass
class _Tally:
    """The running totals of a run, kept so a failed run can still report what it did."""

    read: int = 0
    archived: int = 0
    deleted: int = 0
    first_logged_at: datetime | None = None
    last_logged_at: datetime | None = None

    def add(self, chunk: _ChunkOutcome) -> None:
        self.read += chunk.read
        self.archived += chunk.archived
        self.deleted += chunk.deleted
        first, last = chunk.first_logged_at, chunk.last_logged_at
        self.first_logged_at = min(self.first_logged_at or first, first)
        self.last_logged_at = max(self.last_logged_at or last, last)


def run_housekeeping(
    spark: SparkSession,
    config: TidingsConfig,
    *,
    older_than: timedelta | None = None,
    event_limit: int | None = None,
    now: datetime | None = None,
    progress: Progress | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> HousekeepingResult:
    """Archive (or just delete) the old PUBLISHED events, announce it, trim the batch log.

    ``older_than`` and ``event_limit`` override the configuration (the scheduler event's
    time limit takes precedence over the configured one). ``progress`` is called with
    (rows done, rows in total) at the start and after every chunk.
    """
    settings = config.housekeeping
    older_than = settings.older_than if older_than is None else older_than
    event_limit = settings.event_limit if event_limit is None else event_limit
    _check_arguments(older_than, event_limit, chunk_size)
    now = as_utc(now or utcnow())
    engine = shared_engine(config.database.url)
    ensure_schema(engine)
    selection = _Selection.at(now, older_than)
    total = _count(engine, selection, event_limit)
    archive_path = spark_location(settings.archive_dir) if settings.mode == "archive" else None
    log.info(
        "housekeeping started",
        extra={
            "mode": settings.mode,
            "updated_before": selection.updated_before.isoformat(),
            "logged_before": selection.logged_before.isoformat(),
            "candidates": total,
            "archive_path": archive_path,
        },
    )
    tally = _Tally()
    owner = new_owner()
    if not try_acquire(engine, LEASE, owner, _LEASE_S):
        log.warning("another housekeeping run holds the lease; skipping this run")
        return HousekeepingResult(0, 0, archive_path, None, None, settings.mode)
    try:
        if archive_path is None:
            step: ChunkStep = partial(_delete_chunk, engine, selection)
        else:
            _settle_staged(spark, engine, archive_path)
            step = partial(_archive_chunk, spark, engine, selection, archive_path)
        _run_chunks(_leased(step, engine, owner), tally, total, event_limit, chunk_size, progress)
    finally:
        release(engine, LEASE, owner)
        if tally.deleted:
            _announce(engine, config, tally, settings.mode)
    trimmed = _trim_batch_log(engine, now - older_than)
    result = HousekeepingResult(
        deleted=tally.deleted,
        archived=tally.archived,
        archive_path=archive_path,
        first_logged_at=tally.first_logged_at,
        last_logged_at=tally.last_logged_at,
        mode=settings.mode,
        batch_log_trimmed=trimmed,
    )
    log.info("housekeeping finished", extra=_log_fields(result))
    return result


def _leased(step: ChunkStep, engine: Engine, owner: str) -> ChunkStep:
    """``step``, with the lease renewed before each chunk (a run may outlast one TTL)."""

    def renewed(after: int, size: int) -> _ChunkOutcome | None:
        if not try_acquire(engine, LEASE, owner, _LEASE_S):
            raise HousekeepingError("lost the housekeeping lease to another run; stopping")
        return step(after, size)

    return renewed


def _check_arguments(older_than: timedelta, event_limit: int | None, chunk_size: int) -> None:
    if older_than < timedelta(0):
        raise UsageError(f"older_than must not be negative, got {older_than}")
    if event_limit is not None and event_limit <= 0:
        raise UsageError(f"event_limit must be positive, got {event_limit}")
    if chunk_size <= 0:
        raise UsageError(f"chunk_size must be positive, got {chunk_size}")


def _count(engine: Engine, selection: _Selection, event_limit: int | None) -> int:
    query = select(func.count()).select_from(outbox_event).where(*selection.where())
    with engine.connect() as conn:
        count = conn.execute(query).scalar_one()
    return count if event_limit is None else min(count, event_limit)


def _run_chunks(
    step: ChunkStep,
    tally: _Tally,
    total: int,
    event_limit: int | None,
    chunk_size: int,
    progress: Progress | None,
) -> None:
    """Take chunks in seq order until none is left or the event limit is reached.

    The selection cannot grow during the run: a row changed now has ``updated_at`` past the
    cutoff, which is never later than the start of today.
    """
    after = 0
    if progress is not None:
        progress(0, total)
    while event_limit is None or tally.read < event_limit:
        size = chunk_size if event_limit is None else min(chunk_size, event_limit - tally.read)
        chunk = step(after, size)
        if chunk is None:
            return
        tally.add(chunk)
        after = chunk.last_seq
        if progress is not None:
            progress(tally.read, total)


def _select_rows(
    conn: Connection,
    selection: _Selection,
    after: int,
    size: int,
    columns: Sequence[Column[Any]],
) -> Sequence[Row[Any]]:
    query = (
        select(*columns)
        .where(*selection.where(), outbox_event.c.seq > after)
        .order_by(outbox_event.c.seq)
        .limit(size)
    )
    return conn.execute(query).all()


def _delete_chunk(
    engine: Engine, selection: _Selection, after: int, size: int
) -> _ChunkOutcome | None:
    """Delete mode: read only what the deletion and its announcement need."""
    columns = [outbox_event.c.seq, outbox_event.c.logged_at]
    with engine.connect() as conn:
        rows = _select_rows(conn, selection, after, size, columns)
    if not rows:
        return None
    return _finish_chunk(engine, [r.seq for r in rows], [r.logged_at for r in rows], archived=0)


def _archive_chunk(
    spark: SparkSession,
    engine: Engine,
    selection: _Selection,
    path: str,
    after: int,
    size: int,
) -> _ChunkOutcome | None:
    """Archive mode: write the chunk to Parquet, then delete what was written."""
    with engine.connect() as conn:  # one read transaction: rows and attributes agree
        rows = _select_rows(conn, selection, after, size, list(outbox_event.columns))
        attributes = _attributes(conn, selection, rows[0].seq, rows[-1].seq) if rows else {}
    if not rows:
        return None
    staged = f"{path}/{STAGING_DIR}/chunk-{rows[0].seq}-{rows[-1].seq}"
    _write_parquet(spark, _archive_table(rows, attributes), staged)
    outcome = _finish_chunk(
        engine, [r.seq for r in rows], [r.logged_at for r in rows], archived=len(rows)
    )
    _move_into_archive(spark, staged, path)
    return outcome


def _settle_staged(spark: SparkSession, engine: Engine, path: str) -> None:
    """Finish or drop the chunks a crashed run left in the staging directory.

    A chunk without Spark's ``_SUCCESS`` marker was never fully written, so its rows were
    never deleted: dropped. A written one whose data files are all moved already (a crash
    just before its directory went): removed. Otherwise the database decides: rows still
    there, dropped (they are archived again); rows gone, moved in.
    """
    fs, staging = _filesystem(spark, f"{path}/{STAGING_DIR}")
    if not fs.exists(staging):
        return
    jvm = spark.sparkContext._jvm
    for status in fs.listStatus(staging):
        staged = status.getPath()
        written = fs.exists(jvm.org.apache.hadoop.fs.Path(staged, "_SUCCESS"))
        seqs = _staged_seqs(spark, fs, staged) if written else []
        if seqs:
            with engine.connect() as conn:
                query = select(func.count()).where(outbox_event.c.seq.in_(seqs[:_CHECK_ROWS]))
                left = conn.execute(query).scalar_one()
            if not left:
                log.warning(
                    "moving in a staged chunk whose rows were deleted", extra={"path": str(staged)}
                )
                _move_into_archive(spark, staged.toString(), path)
                continue
        log.warning("dropping a staged chunk", extra={"path": str(staged), "written": written})
        fs.delete(staged, True)


def _staged_seqs(spark: SparkSession, fs: Any, staged: Any) -> list[int]:
    """The seqs of a staged chunk's data files (none if they were all moved in)."""
    files = fs.listFiles(staged, True)
    found = False
    while files.hasNext() and not found:
        status = files.next()
        found = (
            status.getPath().getName().endswith(".parquet")
            and "/_" not in status.getPath().toString()[len(staged.toString()) :]
        )
    if not found:
        return []
    return [row.seq for row in spark.read.parquet(staged.toString()).select("seq").collect()]


def _move_into_archive(spark: SparkSession, staged: str, path: str) -> None:
    """Move a staged chunk's files to their partition directories in the archive, named
    after the chunk, then remove the staging directory. Safe to repeat after a crash: a
    moved file is no longer in the staging directory."""
    fs, source = _filesystem(spark, staged)
    source = fs.makeQualified(source)  # listed files come qualified (file:/..., hdfs://...)
    chunk = source.getName()
    files = fs.listFiles(source, True)
    jvm = spark.sparkContext._jvm
    while files.hasNext():
        status = files.next()
        name = status.getPath().getName()
        if not name.endswith(".parquet"):
            continue
        partition = status.getPath().getParent().toString()[len(source.toString()) :]
        target = jvm.org.apache.hadoop.fs.Path(f"{path}{partition}/{chunk}-{name}")
        target = fs.makeQualified(target)
        fs.mkdirs(target.getParent())
        if not fs.rename(status.getPath(), target):
            raise HousekeepingError(f"could not move {status.getPath()} to {target}")
    fs.delete(source, True)


def _filesystem(spark: SparkSession, location: str) -> tuple[Any, Any]:
    """The Hadoop file system of ``location`` (local, HDFS, S3A ...) and its path object."""
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(location)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return hadoop_path.getFileSystem(conf), hadoop_path


def _attributes(conn: Connection, selection: _Selection, first: int, last: int) -> dict[str, str]:
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


def _archive_table(rows: Sequence[Row[Any]], attributes: Mapping[str, str]) -> pa.Table:
    columns: list[Sequence[Any]] = list(zip(*rows, strict=True))
    columns.append([attributes.get(r.event_id, "{}") for r in rows])
    columns.append([as_utc(r.logged_at).strftime("%Y-%m-%d") for r in rows])
    return pa.Table.from_arrays(
        [_arrow_column(values, f) for values, f in zip(columns, ARCHIVE_SCHEMA, strict=True)],
        schema=ARCHIVE_SCHEMA,
    )


def _arrow_column(values: Sequence[Any], field: pa.Field) -> pa.Array:
    """SQLite gives naive UTC datetimes, PostgreSQL aware ones: archive both as UTC."""
    if pa.types.is_timestamp(field.type):
        values = [None if v is None else as_utc(v) for v in values]
    return pa.array(values, type=field.type)


def _write_parquet(spark: SparkSession, table: pa.Table, path: str) -> None:
    """Write the chunk (again, if a crashed run staged it); one file per (day, event type)
    rather than one per Arrow batch."""
    frame = spark.createDataFrame(table).repartition("day", "event_type")
    frame.write.mode("overwrite").partitionBy("day", "event_type").parquet(path)


def _finish_chunk(
    engine: Engine, seqs: list[int], logged_at: list[datetime], *, archived: int
) -> _ChunkOutcome:
    deleted = _delete_rows(engine, seqs)
    outcome = _ChunkOutcome(
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


def _delete_rows(engine: Engine, seqs: Sequence[int]) -> int:
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


def _announce(engine: Engine, config: TidingsConfig, tally: _Tally, mode: str) -> None:
    """Emit OutboxDeletionCompleted into the log, so it is routed like any other event."""
    payload = {
        "count": tally.deleted,
        "from": _iso(tally.first_logged_at),
        "to": _iso(tally.last_logged_at),
        "mode": mode,
    }
    with Outbox(engine, config.outbox).transaction() as tx:
        event_id = tx.emit(DELETION_EVENT, payload)
    log.info("housekeeping deletion announced", extra={"event_id": event_id, **payload})


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _trim_batch_log(engine: Engine, before: datetime) -> int:
    """Delete batch-log rows finished before ``before``, keeping two rows of every job.

    The newest row is what ``tidings status`` shows; the row with the highest ``max_seq``
    is the job's watermark (the relay's resume point and the replay job's boundary).
    """
    newest = select(func.max(batch_log.c.id)).group_by(batch_log.c.job)
    top = (
        select(batch_log.c.job, func.max(batch_log.c.max_seq).label("max_seq"))
        .group_by(batch_log.c.job)
        .subquery()
    )
    highest = select(batch_log.c.id).join(
        top, and_(batch_log.c.job == top.c.job, batch_log.c.max_seq == top.c.max_seq)
    )
    query = batch_log.delete().where(
        batch_log.c.finished_at < before,
        batch_log.c.id.not_in(newest),
        batch_log.c.id.not_in(highest),
    )
    with engine.begin() as conn:
        return conn.execute(query).rowcount


def _log_fields(result: HousekeepingResult) -> dict[str, Any]:
    return {
        "mode": result.mode,
        "deleted": result.deleted,
        "archived": result.archived,
        "archive_path": result.archive_path,
        "first_logged_at": _iso(result.first_logged_at),
        "last_logged_at": _iso(result.last_logged_at),
        "batch_log_trimmed": result.batch_log_trimmed,
    }
