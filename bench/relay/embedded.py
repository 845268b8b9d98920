"""Phases 2, 2b, 2d and 2c: the relay's rate into the event store (its own ceiling, the target
costing little), the same on PostgreSQL and with the outbox on MariaDB, and whether the cost
of an event grows with the backlog or with the log behind it."""

from __future__ import annotations

import shutil
import statistics
import uuid
from pathlib import Path
from typing import Any

from bench.harness.cpu import postgres_cpu
from bench.harness.databases import mariadb_scratch_database, scratch_database
from bench.harness.outbox import status_counts
from bench.harness.progress import say
from bench.harness.report import Report
from bench.relay.breakdown import (
    bound_text,
    describe_breakdown,
    describe_floor,
    relay_breakdown,
    sqlite_floor,
)
from bench.relay.drains import (
    Drain,
    describe_batches,
    embedded_drain,
    outbox_fill,
    relay_drain,
    report_drain,
    sql_fill,
)
from bench.relay.pg_floor import floor_of
from bench.relay.workload import (
    EVENT_TYPE,
    GOALS,
    RelaySizes,
    bench_config,
    fill_backlog,
    sqlite_url,
    store_count,
)
from tidings.config import TidingsConfig
from tidings.db import make_engine
from tidings.outbox.producer import Outbox


def phase_embedded(spark: Any, work: Path, sizes: RelaySizes, report: Report) -> None:
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


def phase_postgres(spark: Any, work: Path, sizes: RelaySizes, report: Report) -> None:
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
        server_before = sum(postgres_cpu().values())
        secs = fill_backlog(Outbox(engine, cfg.outbox), n, sizes.partition_keys)
        say(f"  backlog inserted in {secs:.1f} s ({n / secs:,.0f} ev/s via Outbox)")
        engine.dispose()  # no connection to the log while it is copied
        with scratch_database(f"tidings_bench_floor_{tag}", template=app_url) as floor_url:
            drain_before = sum(postgres_cpu().values())
            secs, batches, monitor = relay_drain(spark, cfg)
            server = sum(postgres_cpu().values())
            counts = status_counts(engine)
            stored = store_count(store_url)
            engine.dispose()
            say("  PostgreSQL's own work for the same backlog (raw psycopg, no relay) ...")
            floor = floor_of(floor_url, copy=False)
    report.workload_cpu = server - server_before
    report.detail(
        "postgres",
        f"the PostgreSQL server used {server - drain_before:.1f} CPU-s "
        f"({(server - drain_before) / n * 1e6:.0f} us per event)",
    )
    drain = Drain(n, secs, counts, stored, batches, monitor)
    report_drain(report, "2b", "relay_postgres_ev_s", "postgres", drain)
    report.figures["postgres_floor_ev_s"] = round(n / floor.server)
    report.detail("postgres", floor.per_event(n))
    say(f"  {floor.per_event(n)}")


def phase_mariadb(spark: Any, work: Path, sizes: RelaySizes, report: Report) -> None:
    """Phase 2d, ``relay_mariadb_ev_s``: phase 2 with the outbox on MariaDB (the local
    server, a fresh database; the event store stays a SQLite file, as the event store does
    not run on MySQL): the relay's rate beside SQLite's and PostgreSQL's, the gap-safe
    watermark of writer slots included."""
    n = sizes.embedded_events
    say(f"phase 2d: relay with the outbox on MariaDB, backlog of {n:,} events")
    tag = uuid.uuid4().hex[:8]
    with mariadb_scratch_database(f"tidings_bench_app_{tag}") as app_url:
        store_url = sqlite_url(work / f"mariadb-store-{tag}.db")
        store = {"kind": "event_store", "url": store_url, "type_prefix": ["b"]}
        cfg = bench_config(work, "mariadb", {"store": store}, {EVENT_TYPE: ["store"]}, app_url)
        engine = make_engine(cfg.database.url)
        secs = fill_backlog(Outbox(engine, cfg.outbox), n, sizes.partition_keys)
        say(f"  backlog inserted in {secs:.1f} s ({n / secs:,.0f} ev/s via Outbox)")
        secs, batches, monitor = relay_drain(spark, cfg)
        counts = status_counts(engine)
        stored = store_count(store_url)
        engine.dispose()
    drain = Drain(n, secs, counts, stored, batches, monitor)
    report_drain(report, "2d", "relay_mariadb_ev_s", "mariadb", drain)


def phase_scaling(spark: Any, work: Path, sizes: RelaySizes, report: Report) -> None:
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
