"""What bounds a relay that misses its rate goal, measured without Spark: the relay's task code
run in this process on a copy of the backlog, stage by stage, and SQLite's own work for the
same events with raw ``sqlite3`` (the ceiling of any relay on SQLite)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness.outbox import max_seq
from bench.relay.workload import pragma_db, sqlite_url
from tidings.config import TidingsConfig
from tidings.db import make_engine, sqlite_text
from tidings.server.store import EventStore
from tidings.server.store.schema import INSERT_EVENT_SQL


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
    from tidings.pipeline.source.workerheap import collection_paused
    from tidings.routing.table import current_routes

    publisher = Publisher(
        engine,
        current_routes(cfg, engine),
        lambda name: target if name == target_name else None,
        cfg.relay.retry,
    )
    publisher._flush = _timing(timings, "status UPDATEs (flush)", publisher._flush)  # type: ignore[method-assign]
    with collection_paused():  # as publish_task runs it
        _timed_chunks(publisher, read_slice(engine, part), timings)


def _timed_chunks(publisher: Any, chunks: Any, timings: Any) -> None:
    """Read each chunk, then publish it: each timed into ``timings``."""
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
    app, store = pragma_db(app_path), pragma_db(store_path)
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
