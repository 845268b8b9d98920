"""The housekeeping job on real SQLite files (and the local PostgreSQL and MariaDB) and the
shared local SparkSession.

Rows are emitted through the producer and then aged with direct UPDATEs. Every run gets a
fixed ``now``, so which rows count as "today" never depends on when the tests run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession
from sqlalchemy import Engine, select

from tidings.config import TidingsConfig, load_config
from tidings.db import shared_engine
from tidings.events.outbox import EventStatus
from tidings.outbox.envelope import EventDraft
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import batch_log, outbox_event, outbox_event_attribute
from tidings.pipeline import lease
from tidings.pipeline.archive_layout import STAGING_DIR
from tidings.pipeline.housekeeping import archiving
from tidings.pipeline.housekeeping.run import (
    DELETION_EVENT,
    LEASE,
    HousekeepingResult,
    run_housekeeping,
)

pytestmark = pytest.mark.spark

NOW = datetime(2024, 5, 17, 12, 0, tzinfo=UTC)
TODAY = datetime(2024, 5, 17, tzinfo=UTC)
OLD = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)  # 16 days before NOW
OLDER = datetime(2024, 4, 30, 8, 0, tzinfo=UTC)


def make_config(
    tmp_path: Path, database_url: str | None = None, **housekeeping: Any
) -> TidingsConfig:
    return load_config(
        {
            "database": {"url": database_url or f"sqlite:///{tmp_path / 'app.db'}"},
            "housekeeping": {"archive_dir": str(tmp_path / "archive"), **housekeeping},
        }
    )


@pytest.fixture
def config(tmp_path: Path) -> TidingsConfig:
    return make_config(tmp_path)


def engine_of(config: TidingsConfig) -> Engine:
    return shared_engine(config.database.url)


def attributes_of(draft: EventDraft) -> dict[str, str]:
    return {"customer": f"c{draft.payload['n']}", "region": "eu"}


def emit(
    config: TidingsConfig,
    status: EventStatus,
    logged_at: datetime,
    *,
    event_type: str = "OrderPlaced",
    updated_at: datetime | None = None,
    n: int = 0,
) -> str:
    """Emit one event with attributes, then give it a status and an age."""
    engine = engine_of(config)
    outbox = Outbox(engine, config.outbox, attribute_extractor=attributes_of)
    with outbox.transaction() as tx:
        event_id = tx.emit(event_type, {"n": n})
    with engine.begin() as conn:
        conn.execute(
            outbox_event.update()
            .where(outbox_event.c.event_id == event_id)
            .values(
                status=status.value,
                logged_at=logged_at,
                updated_at=updated_at or logged_at + timedelta(minutes=1),
            )
        )
    return event_id


def event_ids(config: TidingsConfig, *, event_type: str | None = None) -> set[str]:
    query = select(outbox_event.c.event_id)
    if event_type is not None:
        query = query.where(outbox_event.c.event_type == event_type)
    with engine_of(config).connect() as conn:
        return set(conn.scalars(query))


def attribute_owners(config: TidingsConfig) -> set[str]:
    with engine_of(config).connect() as conn:
        return set(conn.scalars(select(outbox_event_attribute.c.event_id)))


def payloads(config: TidingsConfig) -> dict[str, str]:
    with engine_of(config).connect() as conn:
        rows = conn.execute(select(outbox_event.c.event_id, outbox_event.c.payload))
        return {event_id: payload for event_id, payload in rows}


def deletion_events(config: TidingsConfig) -> list[dict[str, Any]]:
    query = select(outbox_event.c.payload).where(outbox_event.c.event_type == DELETION_EVENT)
    with engine_of(config).connect() as conn:
        return [json.loads(body)["data"] for body in conn.scalars(query)]


def archived(spark: SparkSession, result: HousekeepingResult) -> dict[str, Any]:
    assert result.archive_path is not None
    return {row.event_id: row for row in spark.read.parquet(result.archive_path).collect()}


def run(spark: SparkSession, config: TidingsConfig, **kwargs: Any) -> HousekeepingResult:
    return run_housekeeping(spark, config, now=NOW, **kwargs)


def test_old_published_rows_are_archived_then_deleted(
    spark: SparkSession, config: TidingsConfig, tmp_path: Path
) -> None:
    placed = {
        emit(config, EventStatus.PUBLISHED, OLD + timedelta(minutes=i), n=i) for i in range(3)
    }
    shipped = {emit(config, EventStatus.PUBLISHED, OLDER, event_type="OrderShipped", n=9)}
    before = payloads(config)

    result = run(spark, config)

    assert (result.deleted, result.archived, result.mode) == (4, 4, "archive")
    assert result.archive_path == str(tmp_path / "archive")
    assert (result.first_logged_at, result.last_logged_at) == (OLDER, OLD + timedelta(minutes=2))
    assert event_ids(config) - event_ids(config, event_type=DELETION_EVENT) == set()
    rows = archived(spark, result)
    assert set(rows) == placed | shipped
    for event_id, row in rows.items():
        assert row.payload == before[event_id]
        assert row.status == "PUBLISHED"
        assert row.seq > 0
        assert json.loads(row.attributes)["region"] == "eu"
    assert {rows[e].day.isoformat() for e in placed} == {"2024-05-01"}
    assert rows[next(iter(shipped))].logged_at.replace(tzinfo=UTC) == OLDER
    archive = tmp_path / "archive"
    layout = {p.parent.relative_to(archive).as_posix() for p in archive.rglob("*.parquet")}
    assert layout == {
        "day=2024-05-01/event_type=OrderPlaced",
        "day=2024-04-30/event_type=OrderShipped",
    }


def test_attributes_are_archived_and_deleted_with_their_event(
    spark: SparkSession, config: TidingsConfig
) -> None:
    gone = emit(config, EventStatus.PUBLISHED, OLD, n=7)
    kept = emit(config, EventStatus.FAILED, OLD, n=8)

    result = run(spark, config)

    assert json.loads(archived(spark, result)[gone].attributes) == {
        "customer": "c7",
        "region": "eu",
    }
    assert attribute_owners(config) == {kept}


def test_open_and_unroutable_rows_are_never_deleted(
    spark: SparkSession, config: TidingsConfig
) -> None:
    kept = {
        emit(config, status, OLD)
        for status in (
            EventStatus.PENDING,
            EventStatus.HELD,
            EventStatus.FAILED,
            EventStatus.UNROUTABLE,
        )
    }
    gone = emit(config, EventStatus.PUBLISHED, OLD)

    result = run(spark, config, older_than=timedelta(0))

    assert result.deleted == 1
    assert set(archived(spark, result)) == {gone}
    assert event_ids(config) - event_ids(config, event_type=DELETION_EVENT) == kept


def test_the_current_day_is_never_deleted(spark: SparkSession, config: TidingsConfig) -> None:
    yesterday = TODAY - timedelta(hours=2)
    kept = {
        emit(config, EventStatus.PUBLISHED, TODAY + timedelta(minutes=30)),
        # logged yesterday, but published today
        emit(config, EventStatus.PUBLISHED, yesterday, updated_at=TODAY + timedelta(minutes=5)),
    }
    gone = emit(config, EventStatus.PUBLISHED, yesterday)

    result = run(spark, config, older_than=timedelta(0))

    assert set(archived(spark, result)) == {gone}
    assert event_ids(config) - event_ids(config, event_type=DELETION_EVENT) == kept


def test_rows_younger_than_older_than_are_kept(spark: SparkSession, config: TidingsConfig) -> None:
    recent = emit(config, EventStatus.PUBLISHED, NOW - timedelta(days=3))
    emit(config, EventStatus.PUBLISHED, OLD)

    result = run(spark, config)  # the default older_than: 7 days

    assert result.deleted == 1
    assert event_ids(config) - event_ids(config, event_type=DELETION_EVENT) == {recent}


def test_delete_mode_archives_nothing(spark: SparkSession, tmp_path: Path) -> None:
    config = make_config(tmp_path, mode="delete")
    emit(config, EventStatus.PUBLISHED, OLD)
    emit(config, EventStatus.PUBLISHED, OLDER)

    result = run(spark, config)

    assert (result.deleted, result.archived, result.archive_path) == (2, 0, None)
    assert not (tmp_path / "archive").exists()
    assert attribute_owners(config) == set()
    assert deletion_events(config)[0]["mode"] == "delete"


def test_event_limit_takes_the_lowest_seqs_first(
    spark: SparkSession, config: TidingsConfig
) -> None:
    ids = [emit(config, EventStatus.PUBLISHED, OLD - timedelta(minutes=i)) for i in range(5)]

    result = run(spark, config, event_limit=2, chunk_size=1)

    assert result.deleted == 2
    assert set(archived(spark, result)) == set(ids[:2])
    assert set(ids[2:]) <= event_ids(config)


def test_chunks_report_progress_and_archive_everything(
    spark: SparkSession, config: TidingsConfig
) -> None:
    ids = {emit(config, EventStatus.PUBLISHED, OLD + timedelta(seconds=i)) for i in range(5)}
    calls: list[tuple[int, int]] = []

    result = run(
        spark, config, chunk_size=2, progress=lambda done, total: calls.append((done, total))
    )

    assert calls == [(0, 5), (2, 5), (4, 5), (5, 5)]
    assert set(archived(spark, result)) == ids
    assert deletion_events(config)[0]["count"] == 5


def test_deletion_is_announced_with_count_and_time_range(
    spark: SparkSession, config: TidingsConfig
) -> None:
    emit(config, EventStatus.PUBLISHED, OLD)
    emit(config, EventStatus.PUBLISHED, OLDER)
    emit(config, EventStatus.PUBLISHED, OLD + timedelta(hours=1))

    run(spark, config)

    assert deletion_events(config) == [
        {
            "count": 3,
            "from": OLDER.isoformat(),
            "to": (OLD + timedelta(hours=1)).isoformat(),
            "mode": "archive",
        }
    ]
    with engine_of(config).connect() as conn:
        status = conn.scalar(
            select(outbox_event.c.status).where(outbox_event.c.event_type == DELETION_EVENT)
        )
    assert status == EventStatus.PENDING  # routed by the relay like any other event


def test_nothing_to_delete_announces_nothing(spark: SparkSession, config: TidingsConfig) -> None:
    kept = emit(config, EventStatus.PENDING, OLD)
    calls: list[tuple[int, int]] = []

    result = run(spark, config, progress=lambda done, total: calls.append((done, total)))

    assert (result.deleted, result.archived, result.first_logged_at) == (0, 0, None)
    assert calls == [(0, 0)]
    assert event_ids(config) == {kept}


def test_rows_stay_when_the_archive_write_fails(spark: SparkSession, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    config = make_config(tmp_path, archive_dir=str(blocker / "archive"))
    kept = emit(config, EventStatus.PUBLISHED, OLD)

    with pytest.raises(Py4JJavaError, match="not a directory"):
        run(spark, config)

    assert event_ids(config) == {kept}
    assert attribute_owners(config) == {kept}


@pytest.mark.parametrize(
    "server", ["sqlite", pytest.param("mysql_url", marks=pytest.mark.mysql, id="mysql")]
)
def test_batch_log_is_trimmed_but_every_jobs_watermark_kept(
    spark: SparkSession, tmp_path: Path, request: pytest.FixtureRequest, server: str
) -> None:
    """On SQLite and on MySQL/MariaDB (whose DELETE may not read its own table but through
    a derived table)."""
    url = None if server == "sqlite" else request.getfixturevalue(server)
    config = make_config(tmp_path, url)
    rows = [  # (job, max_seq, finished_at)
        ("relay", 10, OLDER),
        ("relay", 20, OLD),
        ("relay", 30, OLD + timedelta(hours=1)),  # newest relay row, old: kept
        ("replay", 25, OLDER),  # highest replay max_seq: kept
        ("replay", 5, OLD),  # newest replay row: kept
        ("other", 1, OLD),
        ("other", 2, NOW - timedelta(days=1)),  # recent: kept
    ]
    emit(config, EventStatus.PENDING, OLD)  # creates the schema
    with engine_of(config).begin() as conn:
        for batch_id, (job, max_seq, finished_at) in enumerate(rows):
            conn.execute(
                batch_log.insert().values(
                    job=job,
                    batch_id=batch_id,
                    max_seq=max_seq,
                    finished_at=finished_at,
                    summary="{}",
                )
            )

    result = run(spark, config)

    with engine_of(config).connect() as conn:
        left = set(conn.execute(select(batch_log.c.job, batch_log.c.max_seq)).tuples())
    assert left == {("relay", 30), ("replay", 25), ("replay", 5), ("other", 2)}
    assert result.batch_log_trimmed == 3
    engine_of(config).dispose()


def test_negative_older_than_is_refused(spark: SparkSession, config: TidingsConfig) -> None:
    with pytest.raises(ValueError, match="older_than"):
        run(spark, config, older_than=timedelta(seconds=-1))


@pytest.mark.parametrize(
    "server",
    [
        pytest.param("pg_url", marks=pytest.mark.postgres, id="postgresql"),
        pytest.param("mysql_url", marks=pytest.mark.mysql, id="mysql"),
    ],
)
def test_server_archives_and_deletes_exactly_the_old_published_rows(
    spark: SparkSession, tmp_path: Path, request: pytest.FixtureRequest, server: str
) -> None:
    """On PostgreSQL and MySQL/MariaDB: the same as on SQLite, the batch log trimmed too."""
    config = make_config(tmp_path, request.getfixturevalue(server))
    gone = {emit(config, EventStatus.PUBLISHED, OLD + timedelta(hours=i), n=i) for i in range(3)}
    kept = {emit(config, EventStatus.FAILED, OLD), emit(config, EventStatus.PUBLISHED, TODAY)}

    result = run(spark, config, chunk_size=2)

    assert (result.deleted, result.archived) == (3, 3)
    assert (result.first_logged_at, result.last_logged_at) == (OLD, OLD + timedelta(hours=2))
    assert set(archived(spark, result)) == gone
    assert event_ids(config) - event_ids(config, event_type=DELETION_EVENT) == kept
    assert attribute_owners(config) == kept
    assert deletion_events(config)[0]["count"] == 3
    engine_of(config).dispose()  # close pooled connections before the database is dropped


@pytest.mark.parametrize("crash_after", ["_write_parquet", "finish_chunk"])
def test_a_crash_between_write_and_delete_archives_nothing_twice(
    spark: SparkSession,
    config: TidingsConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    crash_after: str,
) -> None:
    """A crash after a chunk's Parquet write (before its delete, or after the delete but
    before its files moved in) is settled by the next run: every event archived once.
    The crash is injected (a real one cannot be made to fall between the two steps)."""
    kept = {emit(config, EventStatus.PUBLISHED, OLD + timedelta(minutes=i), n=i) for i in range(5)}
    step = getattr(archiving, crash_after)

    def crashing(*args: Any, **kwargs: Any) -> Any:
        step(*args, **kwargs)  # the step itself happens, then the process "dies"
        raise KeyboardInterrupt("crash")

    monkeypatch.setattr(archiving, crash_after, crashing)
    with pytest.raises(KeyboardInterrupt):
        run(spark, config, chunk_size=3)
    monkeypatch.undo()
    staged = tmp_path / "archive" / STAGING_DIR
    assert [p.name for p in staged.iterdir()] == ["chunk-1-3"]
    deleted_before = crash_after == "finish_chunk"  # else written, not yet deleted
    assert len(event_ids(config) & kept) == (2 if deleted_before else 5)

    result = run(spark, config, chunk_size=3)
    assert result.deleted == (2 if deleted_before else 5)
    assert not staged.exists() or not any(staged.iterdir())
    frame = spark.read.parquet(str(tmp_path / "archive"))
    ids = [row.event_id for row in frame.select("event_id").collect()]
    assert sorted(ids) == sorted(kept)  # each exactly once
    assert event_ids(config) & kept == set()


@pytest.mark.parametrize(
    "leftover",
    [
        "_temporary/0/_temporary/attempt_0/part-00000.snappy.parquet",  # killed mid-write
        "_SUCCESS",  # written and moved in, killed before its directory went
    ],
)
def test_what_a_kill_leaves_in_staging_does_not_block_the_next_run(
    spark: SparkSession, config: TidingsConfig, tmp_path: Path, leftover: str
) -> None:
    kept = {emit(config, EventStatus.PUBLISHED, OLD + timedelta(minutes=i), n=i) for i in range(3)}
    chunk = tmp_path / "archive" / STAGING_DIR / "chunk-1-3"
    (chunk / leftover).parent.mkdir(parents=True, exist_ok=True)
    (chunk / leftover).write_bytes(b"PAR1 truncated")
    result = run(spark, config)
    assert result.deleted == 3 and not chunk.exists()
    frame = spark.read.parquet(str(tmp_path / "archive"))
    assert sorted(r.event_id for r in frame.select("event_id").collect()) == sorted(kept)


def test_two_runs_never_work_at_once(spark: SparkSession, config: TidingsConfig) -> None:
    emit(config, EventStatus.PUBLISHED, OLD)
    owner = lease.new_owner()
    assert lease.try_acquire(engine_of(config), LEASE, owner, 60)
    try:
        assert run(spark, config).deleted == 0  # the other run holds the lease: skipped
    finally:
        lease.release(engine_of(config), LEASE, owner)
    assert run(spark, config).deleted == 1
