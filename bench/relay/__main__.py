"""Benchmark of tidings' producer and relay, side by side with raw baselines.

``python -m bench.relay [--quick] [--keep] [--phases ...] [--events N]``: every phase in
turn (or the ``--phases`` named) in a temporary work directory (the current directory
meanwhile, so that whatever Spark writes stays out of the checkout), then the report; the
package's docstring says what each phase measures. ``--phases embedded postgres mariadb``
runs the relay on SQLite, PostgreSQL and MariaDB side by side in one run; ``--events N``
sets the backlog of phases 2, 2b, 2d and 2c (a tiny one checks that they run).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.harness.machine import code_version, machine_info
from bench.harness.paths import REPO
from bench.harness.progress import runtime_s, say
from bench.harness.report import Report, measured, write_report
from bench.harness.sizes import arguments, mode
from bench.relay.drains import warm_spark
from bench.relay.embedded import phase_embedded, phase_mariadb, phase_postgres, phase_scaling
from bench.relay.jetstream import phase_jetstream
from bench.relay.latency import phase_latency
from bench.relay.memory import phase_pss
from bench.relay.producer import phase_producer
from bench.relay.results import build_result, write_markdown
from bench.relay.workload import SCALE, RelaySizes, bench_config


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


SparkPhase = Callable[[Any, Path, RelaySizes, Report], None]
#: The phases on the shared Spark session, in run order: ``--phases`` name, title, phase.
SPARK_PHASES: list[tuple[str, str, SparkPhase]] = [
    ("embedded", "phase 2 (embedded relay)", phase_embedded),
    ("postgres", "phase 2b (PostgreSQL relay)", phase_postgres),
    ("mariadb", "phase 2d (MariaDB relay)", phase_mariadb),
    ("scaling", "phase 2c (relay scaling)", phase_scaling),
    ("jetstream", "phase 3 (jetstream relay)", phase_jetstream),
    ("latency", "phase 4 (latency)", phase_latency),
]
PHASES = ["producer", "pss", *(key for key, _, _ in SPARK_PHASES)]


def run_phases(
    work: Path, sizes: RelaySizes, quick: bool, report: Report, chosen: list[str]
) -> None:
    """The ``chosen`` phases in turn (run order, not ``chosen``'s), in ``work`` (the current
    directory meanwhile)."""
    if "producer" in chosen:
        measured("phase 1 (producer)", lambda: phase_producer(work, sizes, report), report)
    # The PSS subprocess runs before this process starts its own JVM, so nothing else
    # competes with it for the two cores.
    if "pss" in chosen:
        measured("phase 5 (peak PSS)", lambda: phase_pss(work, sizes, quick, report), report)
    phases = [(name, phase) for key, name, phase in SPARK_PHASES if key in chosen]
    if not phases:
        return
    spark = start_spark(work, report)
    if spark is None:
        return
    try:
        measured("warm-up", lambda: warm_spark(spark, work, report), report)
        for name, phase in phases:
            measured(name, lambda phase=phase: phase(spark, work, sizes, report), report)
    finally:
        spark.stop()


def main() -> int:
    parser = arguments("bench.relay", __doc__, "smaller backlogs")
    parser.add_argument("--keep", action="store_true", help="keep the temporary work directory")
    parser.add_argument(
        "--phases", nargs="+", choices=PHASES, default=PHASES, help="run only these phases"
    )
    parser.add_argument(
        "--events", type=int, help="the backlog of phases 2, 2b, 2d and 2c (default: the size's)"
    )
    args = parser.parse_args()
    sizes = SCALE.pick(args.quick)
    if args.events is not None:
        if args.events < 1:
            parser.error("--events must be at least 1")
        sizes = replace(sizes, embedded_events=args.events)
    work = Path(tempfile.mkdtemp(prefix="tidings-bench-"))
    os.chdir(work)  # anything Spark writes relative to the cwd stays out of the repository
    report = Report()
    say(f"tidings relay benchmark ({mode(args.quick)}), work dir {work}")
    machine = machine_info()
    say(f"machine: {machine}")
    code = code_version()
    say(f"code: {code}")
    try:
        run_phases(work, sizes, args.quick, report, args.phases)
    finally:
        os.chdir(REPO)
        if args.keep:
            say(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.phases != PHASES or args.events is not None:
        report.notes.insert(
            0,
            f"a partial run: phases {', '.join(args.phases)}; "
            f"{sizes.embedded_events:,} events in phases 2, 2b, 2d and 2c",
        )
    result = build_result(machine, code, sizes, args.quick, report)
    runtime = runtime_s()
    paths = write_report(
        "relay", result, write_markdown(result, report, sys.argv[1:], runtime), args.results
    )
    say(f"done in {runtime / 60:.1f} min; met: {result['met']}")
    say(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
