"""Archive mode: a chunk written to Parquet, its rows deleted, its files moved in.

A chunk is written through Spark into a staging directory of its own
(:func:`~tidings.pipeline.archive_layout.staged_chunk`, which readers of the archive skip);
only after that write succeeded are exactly its rows deleted, attributes first, in one
transaction; then its files are moved into their partitions of the archive. A run first
settles what a crashed one staged, by the database's word: a chunk whose rows are still in
the log was never deleted and is dropped (its rows are archived again), one whose rows are
gone is moved in. So the archive holds every deleted event exactly once, whatever step a
crash interrupted. The layout itself (partitions, names, columns) is
:mod:`tidings.pipeline.archive_layout`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from sqlalchemy import Engine, Row, func, select

from tidings.errors import HousekeepingError
from tidings.events.timeutil import as_utc
from tidings.outbox.schema import outbox_event
from tidings.pipeline.archive_layout import (
    OUTBOX_PARTITIONS,
    OUTBOX_SCHEMA,
    STAGING_DIR,
    archived_file,
    day_of,
    staged_chunk,
)
from tidings.pipeline.housekeeping.selection import (
    ChunkOutcome,
    Selection,
    attributes,
    finish_chunk,
    select_rows,
)

log = logging.getLogger("tidings.pipeline.housekeeping")

_CHECK_ROWS = 1_000  # a staged chunk's rows went in one transaction: a sample tells


def archive_chunk(
    spark: SparkSession,
    engine: Engine,
    selection: Selection,
    path: str,
    after: int,
    size: int,
) -> ChunkOutcome | None:
    """Archive mode: write the chunk to Parquet, then delete what was written."""
    with engine.connect() as conn:  # one read transaction: rows and attributes agree
        rows = select_rows(conn, selection, after, size, list(outbox_event.columns))
        found = attributes(conn, selection, rows[0].seq, rows[-1].seq) if rows else {}
    if not rows:
        return None
    staged = staged_chunk(path, rows[0].seq, rows[-1].seq)
    _write_parquet(spark, _archive_table(rows, found), staged)
    outcome = finish_chunk(
        engine, [r.seq for r in rows], [r.logged_at for r in rows], archived=len(rows)
    )
    _move_into_archive(spark, staged, path)
    return outcome


def settle_staged(spark: SparkSession, engine: Engine, path: str) -> None:
    """Finish or drop the chunks a crashed run left in the staging directory.

    A chunk without Spark's ``_SUCCESS`` marker was never fully written, so its rows were
    never deleted: dropped. A written one whose data files are all moved already (a crash
    just before its directory went): removed. Otherwise the database decides: rows still
    there, dropped (they are archived again); rows gone, moved in.
    """
    fs, staging = _filesystem(spark, f"{path}/{STAGING_DIR}")
    if not fs.exists(staging):
        return
    for status in fs.listStatus(staging):
        staged = status.getPath()
        written = fs.exists(_hadoop_path(spark, staged, "_SUCCESS"))
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
    while files.hasNext():
        status = files.next()
        name = status.getPath().getName()
        if not name.endswith(".parquet"):
            continue
        partition = status.getPath().getParent().toString()[len(source.toString()) :]
        target = _hadoop_path(spark, archived_file(path, partition, chunk, name))
        target = fs.makeQualified(target)
        fs.mkdirs(target.getParent())
        if not fs.rename(status.getPath(), target):
            raise HousekeepingError(f"could not move {status.getPath()} to {target}")
    fs.delete(source, True)


def _filesystem(spark: SparkSession, location: str) -> tuple[Any, Any]:
    """The Hadoop file system of ``location`` (local, HDFS, S3A ...) and its path object."""
    hadoop_path = _hadoop_path(spark, location)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return hadoop_path.getFileSystem(conf), hadoop_path


def _hadoop_path(spark: SparkSession, *parts: Any) -> Any:
    """A Hadoop ``Path`` made in the session's JVM (a Py4J object, untyped)."""
    jvm: Any = spark.sparkContext._jvm
    return jvm.org.apache.hadoop.fs.Path(*parts)


def _archive_table(rows: Sequence[Row[Any]], attribute_json: Mapping[str, str]) -> pa.Table:
    columns: list[Sequence[Any]] = list(zip(*rows, strict=True))
    columns.append([attribute_json.get(r.event_id, "{}") for r in rows])
    columns.append([day_of(r.logged_at) for r in rows])
    return pa.Table.from_arrays(
        [_arrow_column(values, f) for values, f in zip(columns, OUTBOX_SCHEMA, strict=True)],
        schema=OUTBOX_SCHEMA,
    )


def _arrow_column(values: Sequence[Any], field: pa.Field) -> pa.Array:
    """SQLite gives naive UTC datetimes, PostgreSQL aware ones: archive both as UTC."""
    if pa.types.is_timestamp(field.type):
        values = [None if v is None else as_utc(v) for v in values]
    return pa.array(values, type=field.type)


def _write_parquet(spark: SparkSession, table: pa.Table, path: str) -> None:
    """Write the chunk (again, if a crashed run staged it); one file per (day, event type)
    rather than one per Arrow batch."""
    frame = spark.createDataFrame(table).repartition(*OUTBOX_PARTITIONS)
    frame.write.mode("overwrite").partitionBy(*OUTBOX_PARTITIONS).parquet(path)
