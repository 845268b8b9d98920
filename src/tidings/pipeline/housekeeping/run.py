"""One housekeeping run: the chunks taken in log order under a lease, then the news.

The rows are handled in chunks in log (``seq``) order, so a million of them never sit in
memory at once; each chunk is deleted (delete mode) or archived, then deleted (archive
mode, :mod:`~tidings.pipeline.housekeeping.archiving`). A database lease keeps two runs
from settling each other's staged chunks; the run renews it before every chunk.

A run that deleted anything says so with an ``OutboxDeletionCompleted`` event, emitted into
the log like any other so that routing delivers it. The run also trims the batch log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from pyspark.sql import SparkSession
from sqlalchemy import Engine, and_, func, select

from tidings.config import TidingsConfig
from tidings.db import shared_engine
from tidings.errors import HousekeepingError, UsageError
from tidings.events.timeutil import as_utc, utcnow
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import batch_log, ensure_schema, outbox_event
from tidings.pipeline.housekeeping.archiving import archive_chunk, settle_staged
from tidings.pipeline.housekeeping.selection import ChunkOutcome, Selection, delete_chunk
from tidings.pipeline.lease import new_owner, release, try_acquire
from tidings.pipeline.spark import spark_location

log = logging.getLogger("tidings.pipeline.housekeeping")

DELETION_EVENT = "OutboxDeletionCompleted"
CHUNK_SIZE = 100_000
#: The lease that keeps two runs from settling each other's staged chunks.
LEASE = "housekeeping"
_LEASE_S = 30 * 60.0  # renewed before every chunk
Progress = Callable[[int, int], None]
ChunkStep = Callable[[int, int], ChunkOutcome | None]


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


@dataclass
class _Tally:
    """The running totals of a run, kept so a failed run can still report what it did."""

    read: int = 0
    archived: int = 0
    deleted: int = 0
    first_logged_at: datetime | None = None
    last_logged_at: datetime | None = None

    def add(self, chunk: ChunkOutcome) -> None:
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
    selection = Selection.at(now, older_than)
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
            step: ChunkStep = partial(delete_chunk, engine, selection)
        else:
            settle_staged(spark, engine, archive_path)
            step = partial(archive_chunk, spark, engine, selection, archive_path)
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

    def renewed(after: int, size: int) -> ChunkOutcome | None:
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


def _count(engine: Engine, selection: Selection, event_limit: int | None) -> int:
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
    newest = select(func.max(batch_log.c.id).label("id")).group_by(batch_log.c.job)
    top = (
        select(batch_log.c.job, func.max(batch_log.c.max_seq).label("max_seq"))
        .group_by(batch_log.c.job)
        .subquery()
    )
    highest = select(batch_log.c.id).join(
        top, and_(batch_log.c.job == top.c.job, batch_log.c.max_seq == top.c.max_seq)
    )
    # Each kept set read through a derived table: MySQL refuses a DELETE whose subquery
    # reads the table it deletes from, but not one that reads a materialised copy.
    kept_newest = newest.subquery()
    kept_highest = highest.subquery()
    query = batch_log.delete().where(
        batch_log.c.finished_at < before,
        batch_log.c.id.not_in(select(kept_newest.c.id)),
        batch_log.c.id.not_in(select(kept_highest.c.id)),
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
