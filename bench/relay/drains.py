"""A relay draining a backlog with ``available_now``: the drain itself (timed, with its process
tree's CPU), the backlogs it drains (emitted through the Outbox, or written in SQL where
millions of rows are needed), and how a drain's rate is recorded; the warm-up relay that
keeps Spark's first start out of the timed phases."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness.outbox import status_counts
from bench.harness.progress import say
from bench.harness.report import Report
from bench.harness.trees import TreeMonitor
from bench.relay.workload import (
    EVENT_TYPE,
    ID_EPOCH_MS,
    bench_config,
    copy_sqlite,
    delete_stream,
    fill_backlog,
    jetstream_target,
    progress_durations,
    sqlite_path,
    store_count,
    store_target,
)
from tidings.config import TidingsConfig
from tidings.db import make_engine, sqlite_text
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import batch_log, ensure_schema


def relay_drain(spark: Any, cfg: TidingsConfig) -> tuple[float, list[dict[str, Any]], TreeMonitor]:
    """Drain the backlog with an ``available_now`` relay; seconds, batches, CPU monitor."""
    from tidings.pipeline.relay_query import start_relay

    monitor = TreeMonitor(os.getpid()).start()
    started = time.perf_counter()
    query = start_relay(spark, cfg, available_now=True)
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    monitor.stop()
    if query.exception() is not None:
        raise RuntimeError(f"relay query failed: {query.exception()}")
    engine = make_engine(cfg.database.url)
    try:
        return elapsed, progress_durations(query, engine), monitor
    finally:
        engine.dispose()


def describe_batches(batches: list[dict[str, Any]], wall: float) -> str:
    trigger = sum(b["ms"].get("triggerExecution", 0) for b in batches) / 1000
    add = sum(b["ms"].get("addBatch", 0) for b in batches) / 1000
    rows = [b["rows"] for b in batches if b["rows"]]
    return (
        f"{len(rows)} micro-batches ({', '.join(f'{r:,}' for r in rows)} rows); Spark "
        f"addBatch (read + publish tasks) {add:.1f} s, whole triggers {trigger:.1f} s, "
        f"query start/stop outside triggers {wall - trigger:.1f} s of {wall:.1f} s wall"
    )


def warm_spark(spark: Any, work: Path, report: Report) -> None:
    """A 10-event relay to both kinds of target, so that phases 2-3 do not time Spark's and
    the Python workers' first start (class loading, imports, connections)."""
    stream, prefix = f"BENCHWARM_{uuid.uuid4().hex[:8]}", f"benchwarm{uuid.uuid4().hex[:8]}"
    cfg = bench_config(
        work,
        "warmup",
        {"store": store_target(work / "warmup"), "nats": jetstream_target(stream, prefix)},
        {EVENT_TYPE: ["store", "nats"]},
    )
    outbox = Outbox(make_engine(cfg.database.url), cfg.outbox)
    fill_backlog(outbox, 10, 5)
    try:
        secs, _, _ = relay_drain(spark, cfg)
    finally:
        asyncio.run(delete_stream(stream))
    counts = status_counts(outbox.engine)
    say(f"  warm-up relay of 10 events took {secs:.1f} s: {counts}")
    if counts.get("PUBLISHED") != 10:
        report.note(f"warm-up relay did not publish all 10 events: {counts}")


@dataclass
class Drain:
    """What one backlog drain into the event store did."""

    events: int
    secs: float
    counts: dict[str, int]
    stored: int
    batches: list[dict[str, Any]]
    monitor: TreeMonitor


def report_drain(
    report: Report, phase: str, figure: str | None, section: str, drain: Drain
) -> float | None:
    """Record a drain's rate as ``figure`` (if given; None unless every event was PUBLISHED
    and stored) with its batches and CPU under ``section``; returns the rate, None if not
    every event was published."""
    n, secs = drain.events, drain.secs
    rate = n / secs
    ok = drain.counts.get("PUBLISHED") == n and drain.stored == n
    say(
        f"phase {phase} result: {figure or section} = {rate:,.0f} ({n:,} in {secs:.1f} s); "
        f"statuses {drain.counts}, event store holds {drain.stored:,}"
    )
    if not ok:
        report.note(
            f"phase {phase}: the relay did not publish everything: {drain.counts}, "
            f"store {drain.stored}"
        )
    if figure is not None:
        report.figures[figure] = round(rate) if ok else None
    report.detail(section, describe_batches(drain.batches, secs))
    report.detail(section, drain.monitor.describe_cpu())
    say(f"  {drain.monitor.describe_cpu()}")
    return rate if ok else None


def embedded_drain(
    spark: Any,
    work: Path,
    name: str,
    fill: Callable[[Any, TidingsConfig], int],
    *,
    keep_copy: Path | None = None,
) -> tuple[Drain, TidingsConfig]:
    """A relay into an event store of its own, draining the backlog that ``fill`` writes
    into its log (``fill`` returns how many of the rows it wrote are the backlog; others
    are rows an earlier relay published). A copy of the log before the drain is kept at
    ``keep_copy``."""
    cfg = bench_config(work, name, {"store": store_target(work / name)}, {EVENT_TYPE: ["store"]})
    engine = make_engine(cfg.database.url)
    try:
        events = fill(engine, cfg)
        published_before = status_counts(engine).get("PUBLISHED", 0)
        if keep_copy is not None:
            copy_sqlite(sqlite_path(cfg), keep_copy)
        secs, batches, monitor = relay_drain(spark, cfg)
        counts = status_counts(engine)
    finally:
        engine.dispose()
    if published_before:  # what the drain did: the rows published before are not its own
        counts["PUBLISHED"] = counts.get("PUBLISHED", 0) - published_before
    stored = store_count(cfg.targets["store"].url)
    return Drain(events, secs, counts, stored, batches, monitor), cfg


def outbox_fill(events: int, keys: int) -> Callable[[Any, TidingsConfig], int]:
    """A backlog of ``events`` emitted through the Outbox (1000 per transaction)."""

    def fill(engine: Any, cfg: TidingsConfig) -> int:
        secs = fill_backlog(Outbox(engine, cfg.outbox), events, keys)
        say(f"  backlog of {events:,} emitted in {secs:.1f} s ({events / secs:,.0f} ev/s)")
        return events

    return fill


def sql_fill(
    events: int, keys: int, published_before: int = 0
) -> Callable[[Any, TidingsConfig], int]:
    """``published_before`` rows as an earlier relay left them (PUBLISHED, confirmed at the
    store, with the batch-log row that makes a new relay start after them), then a backlog
    of ``events``: written in SQL (one statement each), where emitting millions of rows
    would take minutes. Rows are shaped as the Outbox writes them (CloudEvents payload of
    the same size); a key's rows share a bucket, as the Outbox's hash gives them. The WAL is
    checkpointed and truncated afterwards: the Outbox's small transactions never leave more
    than SQLite's auto-checkpoint size in it, where one statement of 5M rows left 3.9 GB (a
    drain behind it ran 19.9k against 21.5k ev/s once truncated, measured)."""

    def fill(engine: Any, cfg: TidingsConfig) -> int:
        started = time.perf_counter()
        ensure_schema(engine)
        with engine.begin() as conn:
            if published_before:
                _insert_rows(conn, 1, published_before, keys, published=True)
                conn.execute(
                    batch_log.insert().values(
                        job="relay",
                        batch_id=0,
                        finished_at=datetime.now(UTC),
                        max_seq=published_before,
                        summary=json.dumps({"events": published_before}),
                    )
                )
            _insert_rows(conn, published_before + 1, events, keys, published=False)
        with engine.connect() as conn:  # as SQLite leaves an Outbox's log: its WAL in the file
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        secs = time.perf_counter() - started
        say(f"  {published_before:,} PUBLISHED rows and a backlog of {events:,} in {secs:.1f} s")
        return events

    return fill


def _insert_rows(conn: Any, first: int, rows: int, keys: int, *, published: bool) -> None:
    """Rows ``first`` .. ``first + rows - 1`` of the log in one INSERT ... SELECT, with event
    ids shaped as the Outbox draws them (:mod:`tidings.events.ids`): version 7, the time in
    milliseconds first (row ``i`` at :data:`ID_EPOCH_MS` + ``i`` / 20: 20 rows a
    millisecond, about the Outbox's own emit rate), then random bits."""
    stamp = sqlite_text(datetime.now(UTC))
    iso = datetime.now(UTC).isoformat()
    state = {"store": {"state": "CONFIRMED", "at": iso}}
    status, done, deliveries = "PENDING", None, None
    if published:
        status, done, deliveries = "PUBLISHED", stamp, json.dumps(state)
    conn.exec_driver_sql(
        "WITH RECURSIVE n(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM n WHERE i < ?), "
        "b(i, t, h) AS MATERIALIZED (SELECT i, printf('%012x', ? + i / 20), "
        "lower(hex(randomblob(16))) FROM n), "
        "r(i, id, k) AS MATERIALIZED (SELECT i, substr(t, 1, 8) || '-' || substr(t, 9, 4) "
        "|| '-7' || substr(h, 14, 3) || '-8' || substr(h, 18, 3) || '-' || substr(h, 21, 12), "
        "(i * 7919) % ? FROM b) "
        "INSERT INTO outbox_event (seq, event_id, event_type, event_version, originator, "
        "partition_key, partition_bucket, payload, headers, logged_at, status, retry_count, "
        "last_publish_at, deliveries, created_at, updated_at, concurrency_version) "
        "SELECT i, id, ?, '1', 'bench', printf('ACC%05d', k), k, "
        'printf(\'{"specversion":"1.0","id":"%s","source":"bench",\''
        ' || \'"type":"%s","time":"%s","datacontenttype":\''
        ' || \'"application/json","dataversion":"1","data":{"account":\''
        ' || \'"ACC%05d","amount":%d,"op":%d},"subject":"ACC%05d",\''
        ' || \'"partitionkey":"ACC%05d"}\', id, ?, ?, k, i % 500 + 1, i, k, k), '
        "'{}', ?, ?, 0, ?, ?, ?, ?, 1 FROM r",
        (
            first,
            first + rows - 1,
            ID_EPOCH_MS,
            keys,
            EVENT_TYPE,
            EVENT_TYPE,
            iso,
            stamp,
            status,
            done,
            deliveries,
            stamp,
            stamp,
        ),
    )
