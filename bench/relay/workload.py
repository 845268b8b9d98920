"""What every phase of the relay benchmark shares: its sizes and goals, the workload (a
deposit: an account UPDATE and its event in one transaction), the relay's configuration with
an event store or JetStream target, backlogs emitted through the Outbox, and what a phase
reads back (statuses, the store's count, Spark's micro-batch progress)."""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from sqlalchemy import select

import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names
from bench.harness.outbox import status_counts
from bench.harness.progress import say
from bench.harness.sizes import Scale, Sizes
from tidings.config import TidingsConfig, load_config
from tidings.db import SQLITE_PRAGMAS, make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import batch_log
from tidings.server.store import EventStore

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
class RelaySizes(Sizes):
    """The relay benchmark's sizes: transactions, backlogs, the latency load."""

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


SCALE = Scale(
    full=RelaySizes(5000, 5, 300, 200_000, 100_000, 10_000, 1000, 20.0, 60.0, 1_000_000),
    quick=RelaySizes(1000, 3, 100, 50_000, 25_000, 10_000, 1000, 8.0, 2.0, 200_000),
)

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
    "postgres_floor_ev_s": ("{:,.0f}", "ev/s: PostgreSQL's own work for phase 2b, one core"),
    "relay_mariadb_ev_s": ("{:,.0f}", "ev/s: the outbox on MariaDB, the store on SQLite"),
    "relay_jetstream_ev_s": ("{:,.0f}", "ev/s"),
    "raw_nats_publish_ev_s": ("{:,.0f}", "msg/s"),
    "latency_p50_ms": ("{:,.0f}", "ms"),
    "latency_p99_ms": ("{:,.0f}", "ms"),
    "peak_pss_mib": ("{:,.0f}", "MiB"),
    "relay_scaling.backlog_2m": ("{:.2f}", "x the rate of a 200k backlog"),
    "relay_scaling.log_5m": ("{:.2f}", "x the rate on a fresh log"),
}
MIB = 2**20


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


def deposit(i: int) -> tuple[str, int]:
    return f"ACC{i % ACCOUNTS:05d}", i % 500 + 1


def emit_deposit(outbox: Outbox, i: int) -> None:
    """One producer transaction through tidings: an account UPDATE and its event."""
    acct, amount = deposit(i)
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


def pragma_db(path: Path) -> sqlite3.Connection:
    """``sqlite3`` on a file, with the PRAGMAs tidings' engines set."""
    db = sqlite3.connect(path)
    for pragma in SQLITE_PRAGMAS:
        db.execute(pragma)
    return db


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
