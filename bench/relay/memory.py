"""Phase 5: the most memory a relay's whole process tree (driver, JVM, Python workers) holds
while it drains a big backlog, as PSS, so that pages shared between its processes are
counted once."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import yaml

from bench.harness.outbox import status_counts
from bench.harness.processes import kill_tree, tidings_cli
from bench.harness.progress import say
from bench.harness.report import Report
from bench.harness.trees import TreeMonitor
from bench.relay.workload import (
    EVENT_TYPE,
    GOALS,
    MIB,
    RelaySizes,
    bench_config,
    fill_backlog,
    mib_by_kind,
    store_count,
    store_target,
)
from tidings.db import make_engine
from tidings.outbox.producer import Outbox


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


def phase_pss(work: Path, sizes: RelaySizes, quick: bool, report: Report) -> None:
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
