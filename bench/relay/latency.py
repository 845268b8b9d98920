"""Phase 4: the delay a consumer sees in normal running, commit to PUBLISHED, of a streaming
relay under a steady paced load (as opposed to the drain rates of phases 2-3)."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from bench.harness.figures import percentile
from bench.harness.outbox import publish_latencies_ms, status_counts
from bench.harness.progress import say
from bench.harness.report import Report
from bench.harness.trees import TreeMonitor
from bench.relay.workload import (
    EVENT_TYPE,
    GOALS,
    RelaySizes,
    bench_config,
    create_accounts,
    emit_deposit,
    progress_durations,
    store_target,
    wait_published,
)
from tidings.config import TidingsConfig
from tidings.db import make_engine
from tidings.events.timeutil import as_utc
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event


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
    from tidings.pipeline.relay_query import start_relay

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


def phase_latency(spark: Any, work: Path, sizes: RelaySizes, report: Report) -> None:
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
