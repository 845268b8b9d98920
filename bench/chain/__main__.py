"""``python -m bench.chain [--quick]``: see :mod:`bench.chain`."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bench.chain import __doc__ as DOC
from bench.chain.phases import (
    GOALS,
    SCALE,
    ChainSizes,
    latencies,
    reference_rate,
    sustained_rate,
    warm_up,
)
from bench.harness.cpu import postgres_cpu
from bench.harness.databases import postgresql_version, scratch_database
from bench.harness.figures import goals_met
from bench.harness.machine import machine_info, machine_text
from bench.harness.markdown import bullets, command, heading, section, table
from bench.harness.progress import runtime_s, say
from bench.harness.report import Report, measured, write_report
from bench.harness.sizes import arguments, mode

T = TypeVar("T")


def run_database(
    spark: Any, work: Path, db: str, url: str | None, sizes: ChainSizes, report: Report
) -> None:
    """The three measurements on one outbox database, as ``<db>.<figure>``."""
    figures = report.figures

    def phase(name: str, fn: Callable[[], T]) -> T | None:
        """One measured phase; on PostgreSQL its server's CPU is the phase's own workload,
        not load from other processes."""

        def run() -> T:
            before = sum(postgres_cpu().values()) if url else 0.0
            try:
                return fn()
            finally:
                if url:
                    report.workload_cpu = sum(postgres_cpu().values()) - before

        return measured(f"{db}: {name}", run, report)

    ref = phase("reference", lambda: reference_rate(spark, work, f"{db}-ref", url, sizes))
    rate = phase("sustained", lambda: sustained_rate(spark, work, f"{db}-chain", url, sizes))
    lat = phase("latency", lambda: latencies(spark, work, f"{db}-lat", url, sizes))
    figures[f"{db}.reference_ev_s"] = None if ref is None else round(ref)
    consumed, relayed = rate or (None, None)
    figures[f"{db}.sustained_ev_s"] = None if consumed is None else round(consumed)
    figures[f"{db}.relay_to_server_ev_s"] = None if relayed is None else round(relayed)
    figures[f"{db}.sustained_ratio"] = None if not (ref and consumed) else round(consumed / ref, 2)
    for key, value in (lat or {}).items():
        figures[f"{db}.{key}"] = value


def main() -> int:
    args = arguments("bench.chain", DOC, "smaller sizes (about 3 minutes)").parse_args()
    sizes = SCALE.pick(args.quick)
    from tidings.config import load_config
    from tidings.pipeline.spark import spark_session

    machine = machine_info()
    say(f"chain benchmark ({mode(args.quick)}): {sizes.as_dict()}; machine {machine_text(machine)}")
    work = Path(tempfile.mkdtemp(prefix="tidings-chain-"))
    spark = spark_session(load_config({}).relay, app_name="tidings-chain-bench")
    report = Report()
    try:
        say("warming Spark up ...")
        warm_up(spark, work)
        run_database(spark, work, "sqlite", None, sizes, report)
        with scratch_database("tidings_chain_bench") as url:
            run_database(spark, work, "postgresql", url, sizes, report)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    met = goals_met(report.figures, GOALS)
    result = {
        "machine": machine,
        "postgresql": postgresql_version(),
        "sizes": sizes.as_dict(),
        "figures": report.figures,
        "goals": GOALS,
        "goals_met": met,
        "notes": report.notes,
        "details": report.details,
    }
    say(json.dumps(report.figures, indent=2))
    write_report("chain", result, _markdown(result, args.quick), args.results)
    return 0 if all(met.values()) else 1


def _markdown(r: dict[str, Any], quick: bool) -> str:
    f, met = r["figures"], r["goals_met"]
    hops = [
        ("commit -> reliable consumer", "latency_consumer"),
        ("commit -> intermediary subscriber", "latency_subscriber"),
        ("commit -> relay confirmed (last_publish_at)", "latency_confirmed"),
        ("commit -> stored by the server (session timestamp)", "latency_stored"),
        ("stored -> reliable consumer", "latency_stored_to_consumer"),
        ("stored -> subscriber", "latency_stored_to_subscriber"),
    ]
    rows = []
    for db in ("sqlite", "postgresql"):
        rows.append(
            (
                db,
                "relay into the embedded store (reference)",
                f"{f.get(f'{db}.reference_ev_s')} ev/s",
            )
        )
        rows.append(
            (
                db,
                "the relay into the event server, confirmed (the relay's hop alone)",
                f"{f.get(f'{db}.relay_to_server_ev_s')} ev/s",
            )
        )
        rows.append(
            (
                db,
                "sustained, commit -> reliable consumer",
                f"{f.get(f'{db}.sustained_ev_s')} ev/s ({f.get(f'{db}.sustained_ratio')} x)",
            )
        )
        for label, key in hops:
            rows.append(
                (
                    db,
                    label,
                    f"p50 {f.get(f'{db}.{key}_p50_ms')} / p99 {f.get(f'{db}.{key}_p99_ms')} ms",
                )
            )
    lines = [
        *heading(
            "The chain, end to end" + (" (quick sizes: not comparable)" if quick else ""),
            command("chain", *(["--quick"] if quick else [])),
            r["machine"],
            runtime_s(),
            more=f" PostgreSQL {r['postgresql']}.",
        ),
        *table(["outbox", "measure", "figure"], "llr", rows),
        "",
        *section("Goals", bullets(f"{k}: {'met' if v else 'missed'}" for k, v in met.items())),
        *section("Notes", bullets(r["notes"]) or ["none"]),
        *section("Details", bullets(d for ds in r["details"].values() for d in ds)),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
