"""Benchmark of tidings' producer and relay, side by side with raw baselines.

Run ``.venv/bin/python bench/relay.py [--quick]`` from the repository. It measures

1. the producer's overhead against raw ``sqlite3`` (same PRAGMAs, same outbox table) and
   against the same row written by hand with SQLAlchemy Core;
2. relay throughput to the embedded event store (a drained backlog, ``available_now``);
   2b. the same with the outbox and the event store on PostgreSQL;
   2c. how the rate holds with a backlog ten times larger, and behind millions of rows
   already published (``relay_scaling``);
3. relay throughput to NATS JetStream, against raw nats-py pipelined publishing;
4. end-to-end latency (commit -> PUBLISHED) of a streaming relay under a paced load;
5. peak PSS of a relay subprocess tree (driver, JVM, Python workers) draining a backlog;

and writes ``bench/results/relay.json`` and ``bench/results/relay.md``. Work files live in a
temporary directory that is removed at the end. NATS JetStream must run on 127.0.0.1:4222,
PostgreSQL on 127.0.0.1:5432 (trust auth; phase 2b makes and drops its own databases).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import psutil
import yaml
from common import (
    LOADED_SHARE,
    REPO,
    TreeMonitor,
    code_version,
    cpu_share,
    goals_met,
    machine_info,
    machine_text,
    max_seq,
    percentile,
    publish_latencies_ms,
    runtime_s,
    say,
    scratch_database,
    status_counts,
    write_report,
)
from processes import kill_tree, tidings_cli
from sqlalchemy import select

import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names
from tidings.config import TidingsConfig, load_config
from tidings.db import SQLITE_PRAGMAS, make_engine, sqlite_text
from tidings.events.timeutil import as_utc
from tidings.outbox.producer import Outbox, partition_bucket
from tidings.outbox.schema import (
    OUTBOX_EVENT_COLUMNS,
    batch_log,
    ensure_schema,
    outbox_event,
    outbox_event_from_row,
)
from tidings.server.store import EventStore
from tidings.server.store.schema import INSERT_EVENT_SQL

NATS_URL = "nats://127.0.0.1:4222"
EVENT_TYPE = "MoneyDeposited"
ACCOUNTS = 1000  # rows of the domain table the producer updates
#: Phase 2c's SQL-written event ids start a day back, in log order as the Outbox's are.
ID_EPOCH_MS = time.time_ns() // 1_000_000 - 86_400_000
UPDATE_SQL = "UPDATE account SET balance = balance + ? WHERE id = ?"
RAW_INSERT_SQL = (
    "INSERT INTO outbox_event (event_id, event_type, event_version, originator, partition_key, "
    "partition_bucket, payload, headers, logged_at, status, retry_count, created_at, "
    "updated_at, concurrency_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


@dataclass(frozen=True)
class Sizes:
    producer_txns: int
    producer_rounds: int
    producer_warmup: int
    embedded_events: int
    jetstream_events: int
    partition_keys: int
    latency_rate: int
    latency_seconds: float
    latency_warmup_s: float
    pss_events: int
    raw_window: int = 5000


FULL = Sizes(5000, 5, 300, 200_000, 100_000, 10_000, 1000, 20.0, 60.0, 1_000_000)
QUICK = Sizes(1000, 3, 100, 50_000, 25_000, 10_000, 1000, 8.0, 2.0, 200_000)

GOALS: dict[str, dict[str, Any]] = {
    "producer_overhead_ratio": {"max": 1.25},
    "producer_overhead_vs_core": {"max": 1.05},
    "relay_embedded_ev_s": {"min": 50_000},
    "relay_postgres_ev_s": {"min": 30_000},
    "relay_jetstream_ev_s": {"min_ratio": 0.8, "of": "raw_nats_publish_ev_s"},
    "latency_p50_ms": {"max": 150},
    "latency_p99_ms": {"max": 500},
    "peak_pss_mib": {"max": 1536},
    "relay_scaling.backlog_2m": {"min": 0.9},
    "relay_scaling.log_5m": {"min": 0.9},
}
#: The figures of relay.json, in report order: their format and unit in relay.md.
UNITS = {
    "producer_overhead_ratio": ("{:.2f}", "x raw sqlite3 time"),
    "producer_overhead_vs_core": ("{:.2f}", "x hand-rolled SQLAlchemy Core outbox time"),
    "relay_embedded_ev_s": ("{:,.0f}", "ev/s"),
    "sqlite_floor_ev_s": ("{:,.0f}", "ev/s: SQLite's own work for phase 2, one core"),
    "relay_postgres_ev_s": ("{:,.0f}", "ev/s"),
    "relay_jetstream_ev_s": ("{:,.0f}", "ev/s"),
    "raw_nats_publish_ev_s": ("{:,.0f}", "msg/s"),
    "latency_p50_ms": ("{:,.0f}", "ms"),
    "latency_p99_ms": ("{:,.0f}", "ms"),
    "peak_pss_mib": ("{:,.0f}", "MiB"),
    "relay_scaling.backlog_2m": ("{:.2f}", "x the rate of a 200k backlog"),
    "relay_scaling.log_5m": ("{:.2f}", "x the rate on a fresh log"),
}
MIB = 2**20


@dataclass
class Report:
    """The figures, plus free-text notes and extra detail for the Markdown report."""

    figures: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    details: dict[str, list[str]] = field(default_factory=dict)
    #: CPU-s that processes outside the relay's tree spent on the phase's own workload
    #: (the PostgreSQL server in phase 2b): not load from others.
    workload_cpu: float = 0.0

    def note(self, text: str) -> None:
        self.notes.append(text)
        say(f"note: {text}")

    def detail(self, section: str, text: str) -> None:
        self.details.setdefault(section, []).append(text)


# -- helpers ---------------------------------------------------------------------------------


def wait_published(engine: Any, count: int, timeout: float) -> None:
    """Wait until at least ``count`` outbox events are PUBLISHED, or ``timeout`` s passed."""
    deadline = time.monotonic() + timeout
    while status_counts(engine).get("PUBLISHED", 0) < count and time.monotonic() < deadline:
        time.sleep(0.1)


def store_count(url: str) -> int:
    store = EventStore(url)
    try:
        return store.count()
    finally:
        store.close()


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def store_target(directory: Path) -> dict[str, Any]:
    return {"kind": "event_store", "url": sqlite_url(directory / "events.db"), "type_prefix": ["b"]}


def jetstream_target(stream: str, prefix: str) -> dict[str, Any]:
    return {"kind": "jetstream", "servers": [NATS_URL], "stream": stream, "subject_prefix": prefix}


def bench_config(
    work: Path,
    name: str,
    targets: dict[str, Any],
    routes: dict[str, list[str]],
    database_url: str | None = None,
) -> TidingsConfig:
    """A configuration with its own directory under ``work`` (database, checkpoints)."""
    directory = work / name
    directory.mkdir(parents=True, exist_ok=True)
    return load_config(
        {
            "database": {"url": database_url or sqlite_url(directory / "app.db")},
            "outbox": {"originator": "bench"},
            "targets": targets,
            "routing": {"routes": routes},
            "relay": {
                "checkpoint_dir": str(directory / "checkpoint"),
                "max_events_per_batch": 100_000,
                "partitions": 2,
            },
        }
    )


def fill_backlog(outbox: Outbox, events: int, keys: int, *, per_tx: int = 1000) -> float:
    """Emit ``events`` events in transactions of ``per_tx``; returns the seconds taken."""
    rng = random.Random(events)
    started = time.perf_counter()
    next_report = 100_000
    for start in range(0, events, per_tx):
        with outbox.transaction() as tx:
            for i in range(start, min(events, start + per_tx)):
                acct = f"ACC{rng.randrange(keys):05d}"
                tx.emit(
                    EVENT_TYPE,
                    {"account": acct, "amount": i % 500 + 1, "op": i},
                    partition_key=acct,
                )
        if events >= 500_000 and start + per_tx >= next_report:
            say(f"  ... {start + per_tx:,} events inserted")
            next_report += 100_000
    return time.perf_counter() - started


def create_accounts(execute: Callable[..., Any]) -> None:
    execute("CREATE TABLE account (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)")
    execute("INSERT INTO account VALUES (?, 0)", [(f"ACC{i:05d}",) for i in range(ACCOUNTS)])


def progress_durations(query: Any, engine: Any) -> list[dict[str, Any]]:
    """Per micro-batch: batch id, events (from the batch log: Spark's input rows are the
    tasks' slices, one per task) and Spark's durationMs map."""
    with engine.connect() as conn:
        logged = conn.execute(
            select(batch_log.c.batch_id, batch_log.c.summary).where(batch_log.c.job == "relay")
        )
        events = {batch_id: json.loads(summary)["events"] for batch_id, summary in logged}
    return [
        {
            "batch": progress.batchId,
            "rows": events.get(progress.batchId, 0),
            "ms": dict(progress.durationMs),
        }
        for progress in query.recentProgress
    ]


def copy_sqlite(src: Path, dst: Path) -> None:
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)


def sqlite_path(cfg: TidingsConfig) -> Path:
    return Path(cfg.database.url.removeprefix("sqlite:///"))


def mib_by_kind(values: dict[str, int]) -> str:
    """``kind MiB, ...`` of the kinds holding at least 1 MiB, by name."""
    return ", ".join(f"{k} {v / MIB:,.0f}" for k, v in sorted(values.items()) if v >= MIB)


# -- 1. producer overhead --------------------------------------------------------------------


def _timed(one: Callable[[int], None], txns: int, warmup: int) -> float:
    """Seconds for ``txns`` calls of ``one`` after ``warmup`` untimed ones."""
    for i in range(warmup):
        one(i)
    started = time.perf_counter()
    for i in range(warmup, warmup + txns):
        one(i)
    return time.perf_counter() - started


def _deposit(i: int) -> tuple[str, int]:
    return f"ACC{i % ACCOUNTS:05d}", i % 500 + 1


def emit_deposit(outbox: Outbox, i: int) -> None:
    """One producer transaction through tidings: an account UPDATE and its event."""
    acct, amount = _deposit(i)
    with outbox.transaction() as tx:
        tx.connection.exec_driver_sql(UPDATE_SQL, (amount, acct))
        tx.emit(EVENT_TYPE, {"account": acct, "amount": amount, "op": i}, partition_key=acct)


def deposit_outbox(path: Path) -> Outbox:
    """An Outbox on a fresh SQLite file that also holds the account table."""
    engine = make_engine(sqlite_url(path))
    outbox = Outbox(engine)
    with engine.begin() as conn:
        create_accounts(conn.exec_driver_sql)
    return outbox


def producer_tidings(path: Path, txns: int, warmup: int) -> float:
    outbox = deposit_outbox(path)
    elapsed = _timed(lambda i: emit_deposit(outbox, i), txns, warmup)
    outbox.engine.dispose()
    return elapsed


def _pragma_db(path: Path) -> sqlite3.Connection:
    """``sqlite3`` on a file, with the PRAGMAs tidings' engines set."""
    db = sqlite3.connect(path)
    for pragma in SQLITE_PRAGMAS:
        db.execute(pragma)
    return db


def _raw_db(path: Path) -> sqlite3.Connection:
    """``sqlite3`` on a file with tidings' own outbox table, its PRAGMAs and the accounts."""
    engine = make_engine(sqlite_url(path))
    ensure_schema(engine)  # tidings' own outbox_event table and indexes
    engine.dispose()
    db = _pragma_db(path)
    create_accounts(lambda sql, rows=None: db.executemany(sql, rows) if rows else db.execute(sql))
    db.commit()
    return db


def _raw_deposit(db: sqlite3.Connection, i: int) -> None:
    """The same transaction as ``emit_deposit``, written by hand: UPDATE, INSERT, commit."""
    acct, amount = _deposit(i)
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    db.execute(UPDATE_SQL, (amount, acct))
    db.execute(
        RAW_INSERT_SQL,
        (
            str(uuid.uuid4()),
            EVENT_TYPE,
            "1",
            "bench",
            acct,
            zlib.crc32(acct.encode()) & 0x7FFFFFFF,
            json.dumps({"account": acct, "amount": amount, "op": i}),
            "{}",
            now,
            "PENDING",
            0,
            now,
            now,
            1,
        ),
    )
    db.commit()


def producer_raw(path: Path, txns: int, warmup: int) -> float:
    db = _raw_db(path)
    elapsed = _timed(lambda i: _raw_deposit(db, i), txns, warmup)
    db.close()
    return elapsed


def _core_outbox(path: Path) -> Any:
    """An engine made as tidings makes its own (same settings), with the outbox table and
    the accounts: what an application writing the outbox row itself would have."""
    engine = make_engine(sqlite_url(path))
    ensure_schema(engine)
    with engine.begin() as conn:
        create_accounts(conn.exec_driver_sql)
    return engine


def _core_deposit(engine: Any, i: int) -> None:
    """The same transaction as ``emit_deposit``, the outbox row written by the application
    itself with SQLAlchemy Core: the hand-rolled outbox a user would otherwise write."""
    acct, amount = _deposit(i)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.exec_driver_sql(UPDATE_SQL, (amount, acct))
        conn.execute(
            outbox_event.insert(),
            {
                "event_id": str(uuid.uuid4()),
                "event_type": EVENT_TYPE,
                "event_version": "1",
                "originator": "bench",
                "partition_key": acct,
                "partition_bucket": partition_bucket(acct, ""),
                "payload": json.dumps({"account": acct, "amount": amount, "op": i}),
                "headers": "{}",
                "logged_at": now,
                "status": "PENDING",
                "retry_count": 0,
                "created_at": now,
                "updated_at": now,
                "concurrency_version": 1,
            },
        )


def producer_core(path: Path, txns: int, warmup: int) -> float:
    engine = _core_outbox(path)
    elapsed = _timed(lambda i: _core_deposit(engine, i), txns, warmup)
    engine.dispose()
    return elapsed


def _profile_group(filename: str, name: str) -> str:
    if filename == "~":
        if "sqlite3" in name:
            return "sqlite3 C calls (execute/commit, incl. WAL writes)"
        if "json" in name:
            return "json encoding"
        return "other built-ins"
    if "sqlalchemy" in filename:
        return "SQLAlchemy (pool checkout/return, transaction, cursor handling)"
    if "tidings" in filename:
        return "tidings (emit checks, envelope, timestamps)"
    if "json" in filename:
        return "json encoding"
    if "uuid" in filename:
        return "uuid4"
    return "other stdlib (datetime, contextlib, ...)"


def profile_producer(work: Path, txns: int) -> list[tuple[str, float]]:
    """cProfile a tidings producer loop; own (tot) time per area, as a share of the total."""
    outbox = deposit_outbox(work / "producer-profile.db")
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(txns):
        emit_deposit(outbox, i)
    profiler.disable()
    outbox.engine.dispose()
    groups: dict[str, float] = defaultdict(float)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.items():
        groups[_profile_group(filename, name)] += tottime
    total = sum(groups.values()) or 1.0
    return sorted(((k, v / total) for k, v in groups.items()), key=lambda kv: -kv[1])


def _producer_rounds(work: Path, sizes: Sizes) -> dict[str, list[float]]:
    """Seconds per round of each side (tidings, raw sqlite3, hand-rolled Core); the sides
    take turns going first, on fresh files each round, so none always runs on a warmer
    cache or a quieter moment."""
    run = {"tidings": producer_tidings, "raw": producer_raw, "core": producer_core}
    times: dict[str, list[float]] = {side: [] for side in run}
    order = list(run)
    for r in range(sizes.producer_rounds):
        for side in order[r % 3 :] + order[: r % 3]:
            path = work / f"producer-{side}-{r}.db"
            secs = run[side](path, sizes.producer_txns, sizes.producer_warmup)
            times[side].append(secs)
            say(
                f"  round {r + 1} {side:7s}: {secs:.3f} s "
                f"({secs / sizes.producer_txns * 1e6:.0f} us/txn)"
            )
    return times


def phase_producer(work: Path, sizes: Sizes, report: Report) -> None:
    """Phase 1, ``producer_overhead_ratio``: a tidings transaction's time over raw sqlite3's.

    The outbox's promise is that emitting an event inside the service's own transaction is
    cheap; the baseline is the least a transactional outbox can cost, the same UPDATE and
    INSERT by hand on the same table with the same PRAGMAs. Ratio of the medians.
    """
    say(
        f"phase 1: producer overhead, {sizes.producer_txns} transactions x "
        f"{sizes.producer_rounds} rounds per side (alternating)"
    )
    times = _producer_rounds(work, sizes)
    t, raw, core = (statistics.median(times[side]) for side in ("tidings", "raw", "core"))
    ratio = t / raw
    report.figures["producer_overhead_ratio"] = round(ratio, 3)
    report.figures["producer_overhead_vs_core"] = round(t / core, 3)
    per_t, per_r, per_c = (x / sizes.producer_txns * 1e6 for x in (t, raw, core))
    say(
        f"phase 1 result: producer_overhead_ratio = {ratio:.2f}, vs Core {t / core:.2f} "
        f"(tidings {per_t:.0f} us/txn, raw sqlite3 {per_r:.0f}, hand-rolled Core "
        f"{per_c:.0f}, medians)"
    )
    report.detail(
        "producer",
        "; ".join(
            f"{side} rounds (s): {', '.join(f'{x:.3f}' for x in secs)}"
            for side, secs in times.items()
        ),
    )
    report.detail(
        "producer",
        f"median per transaction: tidings {per_t:.0f} us, raw {per_r:.0f} us "
        f"(+{per_t - per_r:.0f} us), hand-rolled SQLAlchemy Core {per_c:.0f} us "
        f"(+{per_t - per_c:.0f} us)",
    )
    vs_core = GOALS["producer_overhead_vs_core"]["max"]
    if ratio > GOALS["producer_overhead_ratio"]["max"] or t / core > vs_core:
        _explain_producer(work, sizes, (ratio, per_t, per_r), report)


def _explain_producer(
    work: Path, sizes: Sizes, figures: tuple[float, float, float], report: Report
) -> None:
    """A note on a missed producer goal: where a tidings transaction's extra time goes."""
    ratio, per_t, per_r = figures
    shares = profile_producer(work, min(sizes.producer_txns, 3000))
    top = ", ".join(f"{name} {share:.0%}" for name, share in shares[:5])
    report.note(
        f"producer_overhead_ratio {ratio:.2f} misses the 1.25 goal by "
        f"{ratio - 1.25:.2f} ({ratio / 1.25 - 1:.0%} over): a tidings transaction costs "
        f"{per_t:.0f} us against {per_r:.0f} us for raw sqlite3 (+{per_t - per_r:.0f} us). "
        f"The raw side's cost is almost all the SQLite work itself, so the gap is Python "
        f"overhead per transaction. cProfile of the tidings loop (own time; profiler "
        f"inflates Python shares): {top}."
    )


# -- 2./3. relay throughput ------------------------------------------------------------------


def relay_drain(spark: Any, cfg: TidingsConfig) -> tuple[float, list[dict[str, Any]], TreeMonitor]:
    """Drain the backlog with an ``available_now`` relay; seconds, batches, CPU monitor."""
    from tidings.pipeline.relay import start_relay

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


def _timing(timings: dict[str, float], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, adding the seconds each call takes to ``timings[key]``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timings[key] += time.perf_counter() - t

    return wrapper


def _breakdown_slice(
    engine: Any, cfg: TidingsConfig, target: Any, target_name: str, part: Any, timings: Any
) -> None:
    """One Spark task's work on one log slice, chunk by chunk, each stage timed into
    ``timings``."""
    from tidings.pipeline.publishing.publisher import Publisher
    from tidings.pipeline.source.queries import read_slice
    from tidings.routing.table import current_routes

    publisher = Publisher(
        engine,
        current_routes(cfg, engine),
        lambda name: target if name == target_name else None,
        cfg.relay.retry,
    )
    publisher._flush = _timing(timings, "status UPDATEs (flush)", publisher._flush)  # type: ignore[method-assign]
    chunks = read_slice(engine, part)
    while True:
        t = time.perf_counter()
        rows = next(chunks, None)
        timings["read log slice -> events"] += time.perf_counter() - t
        if rows is None:
            return
        t = time.perf_counter()
        publisher.run(rows)
        timings["publisher total"] += time.perf_counter() - t


def relay_breakdown(
    work: Path, cfg: TidingsConfig, app_db_copy: Path, target_name: str
) -> dict[str, float]:
    """Run the relay's task code in this process, one partition after the other, no Spark.

    Times the stages a Spark task goes through on the same backlog (a copy made before the
    relay ran): reading the log slice into events (chunk by chunk, as a task does), the
    target's publish calls, the status UPDATEs, and the rest of the publisher (ordering
    checks).
    """
    from tidings.pipeline.source.slices import LogSlice
    from tidings.targets.registry import build_target

    engine = make_engine(sqlite_url(app_db_copy))
    upto = max_seq(engine)
    spec = cfg.targets[target_name]
    if spec.kind == "event_store":
        spec = spec.model_copy(update={"url": sqlite_url(work / "breakdown-events.db")})
    target = build_target(target_name, spec)
    timings: dict[str, float] = defaultdict(float)
    target.publish = _timing(timings, "target publish calls", target.publish)  # type: ignore[method-assign]
    parts = cfg.relay.partitions
    try:
        for index in range(parts):
            part = LogSlice(0, upto, index, parts)
            _breakdown_slice(engine, cfg, target, target_name, part, timings)
    finally:
        target.close()
        engine.dispose()
    timings["publisher other (ordering/hold checks)"] = (
        timings.pop("publisher total")
        - timings["target publish calls"]
        - timings["status UPDATEs (flush)"]
    )
    return dict(timings)


def describe_breakdown(timings: dict[str, float], events: int) -> str:
    total = sum(timings.values())
    parts = ", ".join(
        f"{k} {v:.1f} s ({v / total:.0%})"
        for k, v in sorted(timings.items(), key=lambda kv: -kv[1])
    )
    return (
        f"the relay's task code run single-threaded without Spark on a copy of the backlog "
        f"takes {total:.1f} s ({events / total:,.0f} ev/s on one core): {parts}"
    )


def bound_text(timings: dict[str, float], events: int) -> str:
    total = sum(timings.values())
    cores = os.cpu_count() or 1
    return (
        f"{describe_breakdown(timings, events)}; so even spread perfectly over the {cores} "
        f"cores, with no Spark costs at all, this per-event Python work would top out near "
        f"{cores * events / total:,.0f} ev/s. In the relay it also shares the cores with the "
        f"JVM, pays Spark's task launches and new Python workers' imports, and SQLite's "
        f"single writer (event store appends and the outbox status UPDATEs of both tasks "
        f"are serialised)."
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


def phase_embedded(spark: Any, work: Path, sizes: Sizes, report: Report) -> None:
    """Phase 2, ``relay_embedded_ev_s``: events per second a relay drains into the event store.

    The target costs little (a local SQLite file), so this is the relay's own ceiling: how
    fast a backlog built up during an outage or a deploy clears. Counted only if every event
    is PUBLISHED and stored; a missed goal gets the stages timed without Spark.
    """
    n = sizes.embedded_events
    say(f"phase 2: relay to the embedded event store, backlog of {n:,} events")
    backup = work / "embedded-backlog-copy.db"
    fill = outbox_fill(n, sizes.partition_keys)
    drain, cfg = embedded_drain(spark, work, "embedded", fill, keep_copy=backup)
    rate = report_drain(report, "2", "relay_embedded_ev_s", "embedded", drain)
    if rate is not None and rate < GOALS["relay_embedded_ev_s"]["min"]:
        context = f"{describe_batches(drain.batches, drain.secs)}. {drain.monitor.describe_cpu()}"
        _explain_embedded(work, cfg, backup, n, rate, context, report)
    backup.unlink(missing_ok=True)


def phase_scaling(spark: Any, work: Path, sizes: Sizes, report: Report) -> None:
    """Phase 2c, ``relay_scaling``: does the cost of an event grow with the backlog or the log?

    ``backlog_2m``: the rate draining ten times phase 2's backlog; ``log_5m``: the rate
    draining phase 2's backlog behind 24 times as many rows already PUBLISHED. Each is
    divided by the rate of phase 2's backlog on a fresh log, drained before and after them
    (one drain varies by up to 15 % on this kind of machine). All four logs are written in
    SQL the same way (:func:`sql_fill`), so that the ratios compare like with like.
    """
    n, keys = sizes.embedded_events, sizes.partition_keys
    say(f"phase 2c: relay scaling: {n:,} fresh, behind {24 * n:,} PUBLISHED, {10 * n:,} fresh")
    runs = (
        ("fresh", sql_fill(n, keys)),
        ("log_5m", sql_fill(n, keys, published_before=24 * n)),
        ("backlog_2m", sql_fill(10 * n, keys)),
        ("fresh_again", sql_fill(n, keys)),
    )
    rates: dict[str, float | None] = {}
    for name, fill in runs:
        directory = f"scaling-{name}"
        drain, _ = embedded_drain(spark, work, directory, fill)
        rates[name] = report_drain(report, "2c", None, "scaling", drain)
        shutil.rmtree(work / directory, ignore_errors=True)
    fresh_rates = [rates["fresh"], rates["fresh_again"]]
    fresh = None if None in fresh_rates else statistics.mean(fresh_rates)  # type: ignore[type-var]
    for name in ("backlog_2m", "log_5m"):
        rate = rates[name]
        ratio = None if rate is None or fresh is None else round(rate / fresh, 3)
        report.figures[f"relay_scaling.{name}"] = ratio
    report.detail(
        "scaling",
        f"rates (ev/s): fresh log {_rates_text(fresh_rates)} (before, after), behind "
        f"{24 * n:,} PUBLISHED rows {_rates_text([rates['log_5m']])}, backlog of {10 * n:,} "
        f"{_rates_text([rates['backlog_2m']])}. The event store starts empty in each: it is "
        f"the log that grows here.",
    )


def _rates_text(rates: list[float | None]) -> str:
    return " / ".join("n/a" if r is None else f"{r:,.0f}" for r in rates)


def postgres_cpu() -> float:
    """CPU-s used so far by the PostgreSQL server's live processes (taken before the
    benchmark's connections close, so that their backends are still counted)."""
    total = 0.0
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if proc.info["name"] in ("postgres", "postgresql") and times is not None:
            total += times.user + times.system
    return total


def phase_postgres(spark: Any, work: Path, sizes: Sizes, report: Report) -> None:
    """Phase 2b, ``relay_postgres_ev_s``: phase 2 with the outbox and the event store on
    PostgreSQL (the local server, fresh databases): the production setup of a service that
    already runs PostgreSQL."""
    n = sizes.embedded_events
    say(f"phase 2b: relay on PostgreSQL (outbox and event store), backlog of {n:,} events")
    tag = uuid.uuid4().hex[:8]
    with (
        scratch_database(f"tidings_bench_app_{tag}") as app_url,
        scratch_database(f"tidings_bench_store_{tag}") as store_url,
    ):
        store = {"kind": "event_store", "url": store_url, "type_prefix": ["b"]}
        cfg = bench_config(work, "postgres", {"store": store}, {EVENT_TYPE: ["store"]}, app_url)
        engine = make_engine(cfg.database.url)
        server_before = postgres_cpu()
        secs = fill_backlog(Outbox(engine, cfg.outbox), n, sizes.partition_keys)
        say(f"  backlog inserted in {secs:.1f} s ({n / secs:,.0f} ev/s via Outbox)")
        drain_before = postgres_cpu()
        secs, batches, monitor = relay_drain(spark, cfg)
        server = postgres_cpu()
        counts = status_counts(engine)
        stored = store_count(store_url)
        engine.dispose()
    report.workload_cpu = server - server_before
    report.detail("postgres", f"the PostgreSQL server used {server - drain_before:.1f} CPU-s")
    drain = Drain(n, secs, counts, stored, batches, monitor)
    report_drain(report, "2b", "relay_postgres_ev_s", "postgres", drain)


def sqlite_floor(work: Path, backup: Path) -> dict[str, float]:
    """Seconds that SQLite itself takes for the relay's SQL on the backlog's copy, with raw
    ``sqlite3`` and no Python objects: read every row, insert the store's rows into a
    fresh event store (its schema and indexes, in the relay's chunks), and mark the rows
    PUBLISHED with the relay's own UPDATE. The ceiling any relay on SQLite meets."""
    from tidings.pipeline.publishing.outcome import _update_sql
    from tidings.pipeline.source.queries import CHUNK

    app_path, store_path = work / "floor-app.db", work / "floor-store.db"
    shutil.copy(backup, app_path)
    EventStore(sqlite_url(store_path)).close()
    app, store = _pragma_db(app_path), _pragma_db(store_path)
    update = _update_sql("sqlite", "?", over_parked=True)
    stamp = sqlite_text(datetime.now(UTC))
    deliveries = json.dumps({"store": {"state": "CONFIRMED", "at": stamp}})
    timings = {"read": 0.0, "store insert": 0.0, "status update": 0.0}
    try:
        started = time.perf_counter()
        rows = app.execute("SELECT seq, event_id, payload, logged_at FROM outbox_event").fetchall()
        timings["read"] = time.perf_counter() - started
        for first in range(0, len(rows), CHUNK):
            chunk = rows[first : first + CHUNK]
            inserts = [
                (
                    first + i + 1,
                    1,
                    first // CHUNK + 1,
                    first + i + 1,
                    '["MoneyDeposited"]',
                    1_700_000_000_000_000 + first,
                    1_700_000_000_000_000 + i,
                    payload.encode(),
                    "json",
                    event_id,
                )
                for i, (_, event_id, payload, _) in enumerate(chunk)
            ]
            started = time.perf_counter()
            with store:
                store.executemany(INSERT_EVENT_SQL, inserts)
            timings["store insert"] += time.perf_counter() - started
            seqs = json.dumps([seq for seq, *_ in chunk])
            started = time.perf_counter()
            with app:
                app.execute(update, ("PUBLISHED", 0, None, deliveries, stamp, stamp, seqs))
            timings["status update"] += time.perf_counter() - started
    finally:
        app.close()
        store.close()
        for path in work.glob("floor-*.db*"):
            path.unlink()
    return timings


def describe_floor(timings: dict[str, float], events: int) -> str:
    total = sum(timings.values())
    parts = ", ".join(f"{k} {v / events * 1e6:.1f} us" for k, v in timings.items())
    writer = max(timings["store insert"], timings["read"] + timings["status update"])
    return (
        f"SQLite's own work for these events (raw sqlite3 on plain tuples): {parts} per "
        f"event, {total:.1f} s in all = {events / total:,.0f} ev/s on one core; even with the "
        f"two files written at once on both cores, the busier one (one writer per file) "
        f"caps a relay at {events / writer:,.0f} ev/s"
    )


def _explain_embedded(
    work: Path, cfg: TidingsConfig, backup: Path, n: int, rate: float, context: str, report: Report
) -> None:
    """A note on a missed event-store goal: the relay's stages timed without Spark on the
    backlog's copy show what bounds the relay short of Spark's own costs."""
    goal = GOALS["relay_embedded_ev_s"]["min"]
    say("  goal missed: timing the relay's task stages without Spark ...")
    timings = relay_breakdown(work, cfg, backup, "store")
    report.detail("embedded", describe_breakdown(timings, n))
    floor = sqlite_floor(work, backup)
    report.figures["sqlite_floor_ev_s"] = round(n / sum(floor.values()))
    report.detail("embedded", describe_floor(floor, n))
    report.note(
        f"relay_embedded_ev_s {rate:,.0f} misses the 50,000 goal by {goal - rate:,.0f} "
        f"ev/s ({1 - rate / goal:.0%} under). {context}. What bounds it: {bound_text(timings, n)}"
        f" {describe_floor(floor, n)}."
    )


async def delete_stream(stream: str) -> None:
    nc = await nats.connect(NATS_URL)
    try:
        js = nc.jetstream()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)
    finally:
        await nc.close()


async def stream_messages(stream: str) -> int:
    nc = await nats.connect(NATS_URL)
    try:
        info = await nc.jetstream().stream_info(stream)
        return info.state.messages
    finally:
        await nc.close()


async def _publish_window(
    js: Any, subject: str, payload: bytes, headers: dict[str, str], count: int, mode: str
) -> list[Any]:
    """``count`` pipelined publishes with fresh Nats-Msg-Ids, by ``js.publish`` calls
    gathered or by ``js.publish_async`` futures; their acks."""

    def with_id() -> dict[str, str]:
        return {**headers, "Nats-Msg-Id": str(uuid.uuid4())}

    if mode == "publish":
        return await asyncio.gather(
            *(js.publish(subject, payload, headers=with_id()) for _ in range(count))
        )
    futures = [await js.publish_async(subject, payload, headers=with_id()) for _ in range(count)]
    return await asyncio.gather(*futures)


async def raw_publish(
    events: int, payload: bytes, headers: dict[str, str], window: int, mode: str
) -> float:
    """Raw nats-py: pipelined publishes to a fresh stream, acks awaited per window."""
    stream, prefix = f"BENCHRAW_{uuid.uuid4().hex[:8]}", f"benchraw{uuid.uuid4().hex[:8]}"
    subject = f"{prefix}.{EVENT_TYPE}"
    nc = await nats.connect(NATS_URL)
    try:
        js = nc.jetstream(timeout=30, publish_async_max_pending=1 << 30)
        await js.add_stream(name=stream, subjects=[f"{prefix}.>"], duplicate_window=600)
        try:
            warmup = [
                await js.publish_async(
                    subject, payload, headers={**headers, "Nats-Msg-Id": f"w{i}"}
                )
                for i in range(1000)
            ]
            await asyncio.gather(*warmup)  # connection and stream warm before the clock
            started = time.perf_counter()
            for start in range(0, events, window):
                count = min(window, events - start)
                acks = await _publish_window(js, subject, payload, headers, count, mode)
                if any(ack.stream != stream or ack.duplicate for ack in acks):
                    raise RuntimeError("raw publish: unexpected ack")
            elapsed = time.perf_counter() - started
            stored = (await js.stream_info(stream)).state.messages
            if stored != events + len(warmup):
                raise RuntimeError(f"raw publish: stream holds {stored}, expected {events}")
            return elapsed
        finally:
            await js.delete_stream(stream)
    finally:
        await nc.close()


def sample_message(cfg: TidingsConfig) -> tuple[bytes, dict[str, str]]:
    """Payload and header set of one real relay message, for same-size raw messages."""
    from tidings.targets.kinds.jetstream.messages import message_headers

    engine = make_engine(cfg.database.url)
    columns = [outbox_event.c[name] for name in OUTBOX_EVENT_COLUMNS]
    with engine.connect() as conn:
        row = conn.execute(select(*columns).order_by(outbox_event.c.seq).limit(1)).one()
    engine.dispose()
    event = outbox_event_from_row(*row)
    headers = message_headers(event)
    headers.pop("Nats-Msg-Id")
    return event.payload.encode(), headers


@dataclass
class RawNats:
    """The raw nats-py baseline of phase 3: msg/s per publish style, run before and after
    the relay so that a change in the server's speed meanwhile shows."""

    events: int
    payload: bytes
    headers: dict[str, str]
    window: int
    runs: dict[str, list[float]] = field(
        default_factory=lambda: {"publish_async": [], "publish": []}
    )

    def round(self, label: str) -> None:
        for mode in self.runs:
            args = (self.events, self.payload, self.headers, self.window, mode)
            secs = asyncio.run(raw_publish(*args))
            self.runs[mode].append(self.events / secs)
            say(f"  raw nats-py js.{mode} ({label}): {self.events / secs:,.0f} msg/s")

    def best(self) -> tuple[str, float]:
        """The faster publish style and its mean msg/s: the baseline the relay is held to."""
        mode = max(self.runs, key=lambda m: statistics.mean(self.runs[m]))
        return mode, statistics.mean(self.runs[mode])

    def describe(self) -> str:
        mode, _ = self.best()
        return (
            "raw nats-py msg/s, before and after the relay: "
            + "; ".join(
                f"js.{m}: {', '.join(f'{x:,.0f}' for x in v)}" for m, v in self.runs.items()
            )
            + f" (raw_nats_publish_ev_s is the mean of the faster mode, js.{mode}); "
            f"payload {len(self.payload)} B plus the relay's {len(self.headers) + 1} headers, "
            f"Nats-Msg-Id a fresh uuid4, acks awaited per window of {self.window}"
        )


def _drain_to_stream(
    spark: Any, cfg: TidingsConfig, engine: Any, stream: str
) -> tuple[float, list[dict[str, Any]], TreeMonitor, dict[str, int], int]:
    """Relay the backlog to ``stream``; seconds, batches, monitor, statuses, messages stored.
    The stream is deleted afterwards, whatever happened."""
    try:
        secs, batches, monitor = relay_drain(spark, cfg)
        counts = status_counts(engine)
        stored = asyncio.run(stream_messages(stream))
    finally:
        asyncio.run(delete_stream(stream))
    return secs, batches, monitor, counts, stored


def phase_jetstream(spark: Any, work: Path, sizes: Sizes, report: Report) -> None:
    """Phase 3, ``relay_jetstream_ev_s`` against ``raw_nats_publish_ev_s``: a backlog relayed
    to JetStream, and the same number of same-size messages published by nats-py alone.

    The raw figure is what the broker and client allow; the relay's share of it is what the
    outbox bookkeeping around each publish costs. Counted only if every event is PUBLISHED
    and in the stream.
    """
    n = sizes.jetstream_events
    say(f"phase 3: relay to NATS JetStream vs raw nats-py, {n:,} events each")
    stream, prefix = f"BENCH_{uuid.uuid4().hex[:8]}", f"bench{uuid.uuid4().hex[:8]}"
    cfg = bench_config(
        work, "jetstream", {"nats": jetstream_target(stream, prefix)}, {EVENT_TYPE: ["nats"]}
    )
    engine = make_engine(cfg.database.url)
    secs = fill_backlog(Outbox(engine, cfg.outbox), n, sizes.partition_keys)
    say(f"  backlog inserted in {secs:.1f} s")
    payload, headers = sample_message(cfg)
    say(f"  message: {len(payload)} B payload, {len(headers) + 1} headers")
    raw_nats = RawNats(n, payload, headers, sizes.raw_window)
    raw_nats.round("before relay")
    backup = work / "jetstream-backlog-copy.db"
    copy_sqlite(sqlite_path(cfg), backup)
    secs, batches, monitor, counts, stored = _drain_to_stream(spark, cfg, engine, stream)
    raw_nats.round("after relay")
    rate = n / secs
    ok = counts.get("PUBLISHED") == n and stored == n
    if not ok:
        report.note(f"jetstream relay did not publish everything: {counts}, stream {stored}")
    best_mode, raw = raw_nats.best()
    report.figures["relay_jetstream_ev_s"] = round(rate) if ok else None
    report.figures["raw_nats_publish_ev_s"] = round(raw)
    say(
        f"phase 3 result: relay_jetstream_ev_s = {rate:,.0f} ({n:,} in {secs:.1f} s), "
        f"raw_nats_publish_ev_s = {raw:,.0f} (js.{best_mode}); ratio {rate / raw:.2f}; "
        f"stream held {stored:,}, statuses {counts}"
    )
    report.detail("jetstream", describe_batches(batches, secs))
    report.detail("jetstream", monitor.describe_cpu())
    say(f"  {monitor.describe_cpu()}")
    report.detail("jetstream", raw_nats.describe())
    if rate < GOALS["relay_jetstream_ev_s"]["min_ratio"] * raw:
        context = f"{describe_batches(batches, secs)}. {monitor.describe_cpu()}"
        _explain_jetstream(work, cfg, backup, stream, n, (rate, raw), context, report)
    backup.unlink(missing_ok=True)


def _explain_jetstream(
    work: Path,
    cfg: TidingsConfig,
    backup: Path,
    stream: str,
    n: int,
    rates: tuple[float, float],
    context: str,
    report: Report,
) -> None:
    """A note on a missed JetStream goal (``rates``: the relay's and raw nats-py's): the
    relay's stages timed without Spark on the backlog's copy, publishing to ``stream``
    again, show whether the NATS side or the outbox work around it makes the gap."""
    rate, raw = rates
    target = GOALS["relay_jetstream_ev_s"]["min_ratio"] * raw
    say("  goal missed: timing the relay's task stages without Spark ...")
    timings = relay_breakdown(work, cfg, backup, "nats")
    asyncio.run(delete_stream(stream))
    report.detail("jetstream", describe_breakdown(timings, n))
    per_raw = 1e6 / raw
    per_target = timings["target publish calls"] / n * 1e6
    report.note(
        f"relay_jetstream_ev_s {rate:,.0f} misses 0.8 x raw = {target:,.0f} by "
        f"{target - rate:,.0f} ev/s (achieves {rate / raw:.2f} x raw). {context}. Raw nats-py "
        f"spends {per_raw:.0f} us per message; the relay's JetStream publish calls take "
        f"{per_target:.0f} us per event (measured without Spark), so the gap is not the "
        f"NATS side but the outbox work around it. What bounds it: "
        f"{bound_text(timings, n)}"
    )


# -- 4. latency ------------------------------------------------------------------------------


def idle_probe(engine: Any, outbox: Outbox, count: int = 5) -> list[float]:
    """Latency (ms) of single events emitted one at a time into an idle streaming relay."""
    out = []
    for i in range(count):
        with outbox.transaction() as tx:
            event_id = tx.emit(EVENT_TYPE, {"probe": i}, partition_key="probe")
        deadline = time.monotonic() + 60
        query = select(outbox_event.c.logged_at, outbox_event.c.last_publish_at).where(
            outbox_event.c.event_id == event_id, outbox_event.c.status == "PUBLISHED"
        )
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                row = conn.execute(query).first()
            if row is not None:
                out.append((as_utc(row[1]) - as_utc(row[0])).total_seconds() * 1000)
                break
            time.sleep(0.01)
        time.sleep(0.3)
    return out


@dataclass
class Load:
    """What phase 4's paced producer did while the streaming relay ran."""

    probe: list[float]  # ms of single events at idle, before the load
    started: datetime  # wall clock at the load's start
    produced_s: float  # how long offering them took
    behind_s: float  # the producer's worst lag behind its schedule
    monitor: TreeMonitor  # CPU during the load
    batches: list[dict[str, Any]]  # Spark's recent micro-batch progress


def _paced_deposits(outbox: Outbox, total: int, rate: int) -> tuple[float, float]:
    """Emit ``total`` deposits at ``rate`` per second; seconds taken, worst lag behind."""
    start = time.monotonic()
    behind = 0.0
    for i in range(total):
        emit_deposit(outbox, i)
        delay = start + (i + 1) / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            behind = max(behind, -delay)
    return time.monotonic() - start, behind


def _latency_load(spark: Any, cfg: TidingsConfig, outbox: Outbox, total: int, rate: int) -> Load:
    """Start a streaming relay, probe it at idle, then offer the paced load and wait until
    the relay published it (up to 180 s)."""
    from tidings.pipeline.relay import start_relay

    engine = outbox.engine
    query = start_relay(spark, cfg)
    try:
        with outbox.transaction() as tx:  # first micro-batch before the clock starts
            tx.emit(EVENT_TYPE, {"warm": True}, partition_key="warm")
        wait_published(engine, 1, 120)
        probe = idle_probe(engine, outbox)
        say(
            f"  relay is up; single events at idle took {', '.join(f'{x:.0f}' for x in probe)} "
            f"ms; producing ..."
        )
        monitor = TreeMonitor(os.getpid()).start()
        started = datetime.now(UTC)
        produced_s, behind = _paced_deposits(outbox, total, rate)
        say(f"  produced {total:,} events in {produced_s:.1f} s; waiting for the relay ...")
        wait_published(engine, total + 1 + len(probe), 180)
        monitor.stop()
        batches = progress_durations(query, engine)
    finally:
        query.stop()
    return Load(probe, started, produced_s, behind, monitor, batches)


def _batch_summary(batches: list[dict[str, Any]]) -> str | None:
    """Sizes and durations of the micro-batches that carried events; None if none did."""
    busy = [b for b in batches if b["rows"]]
    if not busy:
        return None
    trig = [b["ms"].get("triggerExecution", 0) for b in busy]
    add = [b["ms"].get("addBatch", 0) for b in busy]
    rows_per = [b["rows"] for b in busy]
    return (
        f"{len(busy)} non-empty micro-batches in Spark's recent progress (last "
        f"{len(batches)} kept): median {statistics.median(rows_per):.0f} rows, trigger "
        f"duration median {statistics.median(trig):.0f} ms / max {max(trig)} ms, "
        f"addBatch median {statistics.median(add):.0f} ms"
    )


def phase_latency(spark: Any, work: Path, sizes: Sizes, report: Report) -> None:
    """Phase 4, ``latency_p50_ms`` and ``latency_p99_ms``: commit -> PUBLISHED of a streaming
    relay (trigger 100 ms) under a steady paced load, one event per transaction.

    This is the delay a consumer sees in normal running, as opposed to the drain rates of
    phases 2-3. The load runs for the warm-up and then the measured seconds; the figures
    are the events logged in the measured window (the last). The driver JVM compiles Spark's
    per-batch planning code during the first minute of micro-batches (p50 161, 148, 143 and
    137 ms in four consecutive 25-s loads of one session, measured), so a window right
    after the start would time the compiler, not the relay. Every window's percentiles are
    reported; single events at idle before the load show the fixed cost of one micro-batch.
    """
    rate, seconds, warm = sizes.latency_rate, sizes.latency_seconds, sizes.latency_warmup_s
    total = int(rate * (warm + seconds))
    say(
        f"phase 4: latency, streaming relay (trigger 100ms), {rate} ev/s offered for "
        f"{warm + seconds:g} s, measured over the last {seconds:g} s"
    )
    cfg = bench_config(
        work, "latency", {"store": store_target(work / "latency")}, {EVENT_TYPE: ["store"]}
    )
    engine = make_engine(cfg.database.url)
    outbox = Outbox(engine, cfg.outbox)
    with engine.begin() as conn:
        create_accounts(conn.exec_driver_sql)
    load = _latency_load(spark, cfg, outbox, total, rate)
    counts = status_counts(engine)
    cutoff = load.started.timestamp() + warm
    latencies = publish_latencies_ms(engine, cutoff, exclude_keys=("warm", "probe"))
    if counts.get("PUBLISHED", 0) != total + 1 + len(load.probe):
        report.note(f"latency run: not every event was PUBLISHED: {counts}")
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    report.figures["latency_p50_ms"] = round(p50, 1)
    report.figures["latency_p99_ms"] = round(p99, 1)
    say(
        f"phase 4 result: latency_p50_ms = {p50:.0f}, latency_p99_ms = {p99:.0f} "
        f"(max {max(latencies):.0f}) over {len(latencies):,} events"
    )
    report.note(
        f"latency: {total:,} events offered at {rate}/s for {warm + seconds:g} s, one event per "
        f"transaction (with the account UPDATE); latency = last_publish_at - logged_at from "
        f"the outbox table; events logged in the first {warm:g} s are the warm-up (the JVM "
        f"compiling Spark's per-batch code; see the per-window figures), "
        f"{len(latencies):,} remain. Producer achieved {total / load.produced_s:,.0f} ev/s "
        f"(worst lag behind schedule {load.behind_s * 1000:.0f} ms)."
    )
    report.detail(
        "latency",
        f"single events at idle, before the load (ms): {', '.join(f'{x:.0f}' for x in load.probe)}",
    )
    report.detail("latency", f"during the load: {load.monitor.describe_cpu()}")
    windows = _windows_text(engine, load.started.timestamp(), warm + seconds, seconds)
    report.detail("latency", windows)
    summary = _batch_summary(load.batches)
    if summary is not None:
        report.detail("latency", summary)
    _explain_latency(p50, p99, load, summary or "no micro-batch progress recorded", report)


def _windows_text(engine: Any, started: float, length: float, window: float) -> str:
    """p50/p99 of each ``window`` seconds of a load of ``length`` seconds from ``started``."""
    parts = []
    for first in range(0, int(length), int(window)):
        latencies = publish_latencies_ms(
            engine, started + first, started + first + window, exclude_keys=("warm", "probe")
        )
        if latencies:
            p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
            parts.append(f"{first}-{first + int(window)} s {p50:.0f}/{p99:.0f}")
    return f"p50/p99 (ms) per {window:g}-s window of the load: {', '.join(parts)}"


def _explain_latency(p50: float, p99: float, load: Load, summary: str, report: Report) -> None:
    """A note on missed latency goals: what an event waits for (the next trigger, then a
    whole micro-batch) and what one micro-batch costs at idle."""
    misses = []
    if p50 > GOALS["latency_p50_ms"]["max"]:
        misses.append(f"p50 {p50:.0f} ms misses 150 by {p50 - 150:.0f} ms")
    if p99 > GOALS["latency_p99_ms"]["max"]:
        misses.append(f"p99 {p99:.0f} ms misses 500 by {p99 - 500:.0f} ms")
    if not misses:
        return
    report.note(
        f"latency goal(s) missed: {'; '.join(misses)}. An event waits for the next "
        f"trigger (100 ms interval, or the end of the running batch) and then for a "
        f"whole micro-batch: {summary}. Even a single event on an idle relay took "
        f"{statistics.median(load.probe):.0f} ms (median of {len(load.probe)}): that is the "
        f"fixed cost of one micro-batch (the offset query in the source runner, planning, "
        f"the checkpoint's offset and commit files, a task per slice in a Python worker, "
        f"the batch log). Under load: {load.monitor.describe_cpu()}."
    )


# -- 5. peak PSS -----------------------------------------------------------------------------


def _relay_once(cfg_path: Path, log_path: Path) -> tuple[int, TreeMonitor]:
    """Run ``tidings.cli relay --once`` as a subprocess, summing its tree's PSS every 0.2 s;
    its exit code and the monitor. Ended (the whole process group) after 900 s."""
    with log_path.open("wb") as log:
        proc = tidings_cli(
            "relay",
            "--config",
            str(cfg_path),
            "--once",
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cfg_path.parent,
            start_new_session=True,  # its own process group, so a timeout can end the tree
        )
        monitor = TreeMonitor(proc.pid, pss=True, baseline=False)
        deadline = time.monotonic() + 900
        next_say = time.monotonic() + 15
        while proc.poll() is None:
            if time.monotonic() > deadline:
                kill_tree(proc, 30)
                raise RuntimeError("relay subprocess did not finish within 900 s")
            total = monitor.sample()
            if time.monotonic() >= next_say:
                say(
                    f"  ... running, tree PSS now {total / MIB:,.0f} MiB, "
                    f"peak {monitor.peak / MIB:,.0f}"
                )
                next_say += 15
            time.sleep(0.2)
        monitor.stop()
    return proc.returncode, monitor


def phase_pss(work: Path, sizes: Sizes, quick: bool, report: Report) -> None:
    """Phase 5, ``peak_pss_mib``: the most memory a relay's whole process tree (driver, JVM,
    Python workers) holds while it drains a big backlog.

    PSS shares the pages the processes have in common fairly, so the sum is what the relay
    costs the machine. It runs as a subprocess before this process starts its own JVM.
    """
    n = sizes.pss_events
    say(f"phase 5: peak PSS of a relay subprocess draining {n:,} events (--once)")
    cfg = bench_config(work, "pss", {"store": store_target(work / "pss")}, {EVENT_TYPE: ["store"]})
    engine = make_engine(cfg.database.url)
    secs = fill_backlog(Outbox(engine, cfg.outbox), n, sizes.partition_keys)
    say(f"  backlog inserted in {secs:.1f} s")
    cfg_path = work / "pss" / "tidings.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    log_path = work / "pss" / "relay.log"
    started = time.perf_counter()
    returncode, monitor = _relay_once(cfg_path, log_path)
    elapsed = time.perf_counter() - started
    counts = status_counts(engine)
    stored = store_count(cfg.targets["store"].url)
    if returncode != 0 or counts.get("PUBLISHED") != n or stored != n:
        tail = log_path.read_text(errors="replace")[-1500:]
        report.note(
            f"PSS run: relay exited {returncode}, statuses {counts}, store {stored}; "
            f"log tail: {tail}"
        )
    mib = monitor.peak / MIB
    report.figures["peak_pss_mib"] = round(mib, 1)
    _pss_details(monitor, n, elapsed, report)
    if quick:
        report.note(f"--quick: peak PSS measured on a {n:,}-event backlog, not 1M")
    if mib > GOALS["peak_pss_mib"]["max"]:
        _explain_pss(monitor, report)


def _pss_details(monitor: TreeMonitor, n: int, elapsed: float, report: Report) -> None:
    """Where the peak's memory was, by kind of process, and the drain's speed and CPU."""
    at_peak = mib_by_kind(monitor.peak_parts)
    workers = len([k for k in monitor.kinds.values() if k.startswith("python")])
    say(
        f"phase 5 result: peak_pss_mib = {monitor.peak / MIB:,.0f} (at peak, MiB: {at_peak}); "
        f"relay drained {n:,} in {elapsed:.1f} s incl. Spark start ({n / elapsed:,.0f} ev/s); "
        f"{monitor.samples} samples"
    )
    report.detail(
        "pss",
        f"{n:,} events drained by `tidings.cli relay --once` in {elapsed:.1f} s including "
        f"Spark start ({n / elapsed:,.0f} ev/s); {monitor.samples} samples every 0.2 s; "
        f"{workers} Python worker processes seen over the run",
    )
    report.detail("pss", f"PSS by kind at the peak (MiB): {at_peak}")
    report.detail(
        "pss", f"largest single process of each kind (MiB): {mib_by_kind(monitor.single_peak)}"
    )
    report.detail("pss", monitor.describe_cpu())


def _explain_pss(monitor: TreeMonitor, report: Report) -> None:
    """A note on a missed memory goal: what each kind of process held at the peak, and which
    part varies with the configuration."""
    mib = monitor.peak / MIB
    parts, counts = monitor.peak_parts, monitor.peak_counts
    task = parts.get("python task workers", 0) / MIB
    other = parts.get("python planning/commit workers", 0) / MIB
    n_task = counts.get("python task workers", 0)
    n_other = counts.get("python planning/commit workers", 0)
    report.note(
        f"peak_pss_mib {mib:,.0f} misses the 1536 MiB goal by {mib - 1536:,.0f} MiB "
        f"({mib / 1536 - 1:.0%} over). At the peak: JVM "
        f"{parts.get('JVM', 0) / MIB:,.0f} MiB (heap capped at relay.driver_memory); "
        f"{n_task} Python task "
        f"processes {task:,.0f} MiB (largest "
        f"{monitor.single_peak.get('python task workers', 0) / MIB:,.0f}); {n_other} other "
        f"Python processes (worker daemons, data source lookup and planning, the streaming "
        f"source runner) {other:,.0f} MiB, ~{other / max(n_other, 1):,.0f} MiB each, which "
        f"is what a Python process costs once pyspark and what it runs are imported; "
        f"driver {parts.get('driver', 0) / MIB:,.0f} MiB. The task "
        f"workers are the variable part: a task holds one chunk of its slice (at most "
        f"20,000 events) as Python objects at a time."
    )


# -- report ----------------------------------------------------------------------------------


def goal_text(name: str, figures: dict[str, float | None]) -> str:
    goal = GOALS[name]
    if "max" in goal:
        return f"<= {goal['max']:,g}"
    if "min" in goal:
        return f">= {goal['min']:,g}"
    raw = figures.get(goal["of"])
    ratio = goal["min_ratio"]
    return f">= {ratio:g} x raw" + (f" = {ratio * raw:,.0f}" if raw else "")


DETAIL_TITLES = {
    "producer": "Producer (1)",
    "embedded": "Relay to the event store (2)",
    "postgres": "Relay on PostgreSQL (2b)",
    "scaling": "Relay scaling (2c)",
    "jetstream": "Relay to JetStream (3)",
    "latency": "Latency (4)",
    "pss": "Peak PSS (5)",
    "load": "Machine load by other processes",
}
METHOD = [
    "## Method",
    "",
    "1. Producer: SQLite files in WAL with synchronous=NORMAL; each transaction updates one "
    "account row and adds one event. tidings: `outbox.transaction()` + `tx.emit`; raw: "
    "`sqlite3` on its own file with the same PRAGMAs and tidings' own `outbox_event` table "
    "(created by `ensure_schema`), UPDATE + INSERT (uuid4, json.dumps payload) + commit. "
    "Rounds alternate sides on fresh files after a short warm-up; ratio of medians. "
    "Second baseline (`producer_overhead_vs_core`): the same transaction with the outbox "
    "row written by the application itself through SQLAlchemy Core (`outbox_event.insert()`), "
    "on an engine made with tidings' own settings: the hand-rolled outbox a user would "
    "otherwise write.",
    "2. Embedded: a backlog emitted via Outbox (1000 per transaction, ~10k partition keys) "
    "drained by `start_relay(..., available_now=True)` into an event_store target on "
    "SQLite; Spark started and warmed by a 10-event relay first; max_events_per_batch "
    "100000, partitions 2; the clock covers query start to termination.",
    "2b. PostgreSQL: the same with the outbox and the event store in fresh databases on the "
    "local PostgreSQL server (dropped afterwards).",
    "2c. Scaling: phase 2's drain again on a fresh log; then the same backlog behind 24 times "
    "as many rows already PUBLISHED (written in SQL with the batch-log row an earlier relay "
    "leaves, so the relay starts after them); then a backlog ten times phase 2's. Each rate "
    "is divided by the mean of the two fresh-log rates; each drain has a fresh event store.",
    "3. JetStream: the same with a jetstream target (unique stream, deleted afterwards); "
    "raw baseline: nats-py pipelined publishes of same-size messages with Nats-Msg-Id to "
    "a fresh stream, acks awaited per window; measured before and after the relay.",
    "4. Latency: streaming relay (trigger 100 ms) on a fresh database; paced producer, "
    "one event per transaction; latency = last_publish_at - logged_at; the figures are the "
    "load's last window after its warm-up (full run: the last 20 s of 80, the first 60 s "
    "warm the driver JVM), every window listed.",
    "5. PSS: `python -m tidings.cli relay --config cfg.yaml --once` as a subprocess; the "
    "PSS of its whole process tree (driver, JVM, Python workers) summed every 0.2 s.",
    "",
]


def _figure_rows(result: dict[str, Any], figures: dict[str, float | None]) -> list[str]:
    """The table's rows: each figure with its unit, goal and whether it was met."""
    lines = []
    for name, (fmt, unit) in UNITS.items():
        value = figures.get(name)
        shown = "n/a" if value is None else f"{fmt.format(value)} {unit}"
        if name in GOALS:
            ok = "yes" if result["met"][name] else "**no**"
            lines.append(f"| {name} | {shown} | {goal_text(name, figures)} | {ok} |")
        else:
            lines.append(f"| {name} | {shown} | (baseline) | |")
    return lines


def write_markdown(result: dict[str, Any], report: Report, quick: bool, runtime: float) -> str:
    m = result["machine"]
    lines = [
        "# tidings relay benchmark",
        "",
        f"Run `{'.venv/bin/python bench/relay.py' + (' --quick' if quick else '')}` on "
        f"{m['date']}, {runtime / 60:.1f} min.",
        "",
        f"Machine: {machine_text(m)}; Python {m['python']}, {m['java']}, PySpark {m['pyspark']}.",
        "",
        "| measure | value | goal | met |",
        "|---|---:|---|:---:|",
        *_figure_rows(result, report.figures),
        "",
        "## Notes",
        "",
    ]
    lines += [f"- {n}" for n in result["notes"]] or ["- none"]
    lines += ["", "## Details", ""]
    for key, title in DETAIL_TITLES.items():
        if key in report.details:
            lines += [f"### {title}", ""] + [f"- {d}" for d in report.details[key]] + [""]
    return "\n".join(lines + METHOD)


# -- main ------------------------------------------------------------------------------------


def measured(name: str, fn: Callable[[], None], report: Report) -> None:
    """Run one phase, noting a failure instead of ending the run, and the CPU other
    processes used meanwhile: a phase that shared the cores gets a note saying so."""
    monitor = TreeMonitor(os.getpid()).start(1.0)
    report.workload_cpu = 0.0
    try:
        fn()
    except Exception as exc:
        traceback.print_exc()
        report.note(f"{name} failed: {type(exc).__name__}: {exc}")
    finally:
        monitor.stop()
    foreign, steal = monitor.foreign_cpu()
    foreign = max(0.0, foreign - report.workload_cpu)
    cores = os.cpu_count() or 1
    share = cpu_share(foreign, monitor.wall)
    text = (
        f"{name}: other processes on the machine used {foreign:.1f} CPU-s "
        f"({share:.0%} of {cores} cores) over its {monitor.wall:.0f} s; steal {steal:.1f} s"
    )
    if report.workload_cpu:
        text += f" (not counting {report.workload_cpu:.1f} CPU-s of the phase's own database)"
    say(f"  {text}")
    report.detail("load", text)
    if share > LOADED_SHARE:
        report.note(
            f"{text}: concurrent work (e.g. other test runs) competed for the cores, so "
            f"this phase's figures are lower/slower than on an idle machine"
        )


def start_spark(work: Path, report: Report) -> Any | None:
    """A local Spark session in this process for phases 2-4; None (noted) if it fails."""
    say("starting Spark (local) in this process and warming it up ...")
    try:
        from tidings.pipeline.spark import spark_session

        boot = bench_config(work, "boot", {}, {})
        started = time.perf_counter()
        spark = spark_session(boot.relay, app_name="tidings-bench")
        say(f"  Spark session up in {time.perf_counter() - started:.1f} s")
        return spark
    except Exception as exc:
        traceback.print_exc()
        report.note(f"Spark did not start, phases 2-4 skipped: {type(exc).__name__}: {exc}")
        return None


def run_phases(work: Path, sizes: Sizes, quick: bool, report: Report) -> None:
    """Every phase in turn, in ``work`` (the current directory meanwhile)."""
    measured("phase 1 (producer)", lambda: phase_producer(work, sizes, report), report)
    # The PSS subprocess runs before this process starts its own JVM, so nothing else
    # competes with it for the two cores.
    measured("phase 5 (peak PSS)", lambda: phase_pss(work, sizes, quick, report), report)
    spark = start_spark(work, report)
    if spark is None:
        return
    try:
        measured("warm-up", lambda: warm_spark(spark, work, report), report)
        phases = [
            ("phase 2 (embedded relay)", phase_embedded),
            ("phase 2b (PostgreSQL relay)", phase_postgres),
            ("phase 2c (relay scaling)", phase_scaling),
            ("phase 3 (jetstream relay)", phase_jetstream),
            ("phase 4 (latency)", phase_latency),
        ]
        for name, phase in phases:
            measured(name, lambda phase=phase: phase(spark, work, sizes, report), report)
    finally:
        spark.stop()


def build_result(
    machine: dict[str, Any], code: str, sizes: Sizes, quick: bool, report: Report
) -> dict[str, Any]:
    """relay.json's content: the machine, each figure, the goals and the notes."""
    report.notes.insert(0, f"code measured: {code}")
    if quick:
        report.notes.insert(
            0,
            f"--quick run: smaller sizes ({sizes.producer_txns} producer txns, "
            f"{sizes.embedded_events:,} / {sizes.jetstream_events:,} relay events, "
            f"{sizes.latency_seconds:g} s latency load, {sizes.pss_events:,} PSS backlog)",
        )
    goals, met = GOALS, goals_met(report.figures, GOALS)
    result: dict[str, Any] = {"machine": machine}
    for name in UNITS:  # "relay_scaling.log_5m" goes to relay_scaling: {"log_5m": ...}
        group, _, key = name.rpartition(".")
        into = result.setdefault(group, {}) if group else result
        into[key] = report.figures.get(name)
    result["goals"] = goals
    result["met"] = met
    result["notes"] = report.notes
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller backlogs")
    parser.add_argument("--keep", action="store_true", help="keep the temporary work directory")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    work = Path(tempfile.mkdtemp(prefix="tidings-bench-"))
    os.chdir(work)  # anything Spark writes relative to the cwd stays out of the repository
    report = Report()
    say(f"tidings relay benchmark ({'quick' if args.quick else 'full'}), work dir {work}")
    machine = machine_info()
    say(f"machine: {machine}")
    code = code_version()
    say(f"code: {code}")
    try:
        run_phases(work, sizes, args.quick, report)
    finally:
        os.chdir(REPO)
        if args.keep:
            say(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    result = build_result(machine, code, sizes, args.quick, report)
    runtime = runtime_s()
    paths = write_report("relay", result, write_markdown(result, report, args.quick, runtime))
    say(f"done in {runtime / 60:.1f} min; met: {result['met']}")
    say(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
