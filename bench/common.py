"""Helpers every benchmark in ``bench/`` shares, so that a figure means the same in each report.

One percentile definition, one way of describing the machine and the code measured, one way
of counting the CPU that other processes took meanwhile (a busy machine slows every figure,
and the reports say so), one monitor of a process tree's CPU and memory, and one writer of
the report files in ``bench/results/``. The servers a benchmark starts are started by
``processes.py``, which the tests share.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import psycopg
from sqlalchemy import func, select

from tidings.events.timeutil import as_utc
from tidings.outbox.schema import outbox_event

#: The local PostgreSQL server the benchmarks use (trust auth), without a database.
PG = "postgresql://root@127.0.0.1:5432"


@contextlib.contextmanager
def scratch_database(name: str) -> Iterator[str]:
    """A fresh PostgreSQL database on the local server, dropped afterwards; its URL."""

    def admin(*statements: str) -> None:
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)  # type: ignore[arg-type]

    admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}")
    try:
        yield f"{PG}/{name}"
    finally:
        admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parent.parent
#: A phase whose other processes used more than this share of the cores gets a note: its
#: figures are lower or slower than on an idle machine.
LOADED_SHARE = 0.1
#: Fields of ``psutil.cpu_times()`` that count as a core being busy (steal is reported apart).
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")
_T0 = time.monotonic()


# -- progress and reports --------------------------------------------------------------------


def runtime_s() -> float:
    """Seconds since the benchmark started (this module's import), for progress and reports."""
    return time.monotonic() - _T0


def say(message: str) -> None:
    """One progress line, stamped with the run's elapsed time so slow steps stand out."""
    print(f"[{runtime_s():7.1f}s] {message}", flush=True)


def write_report(
    name: str, result: dict[str, Any], markdown: str, folder: Path = RESULTS
) -> tuple[Path, Path]:
    """Write ``results/<name>.json`` (for comparing runs) and ``results/<name>.md`` (for
    reading, and the README's figures), or into ``folder``; returns both paths."""
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / f"{name}.json", folder / f"{name}.md"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    md_path.write_text(markdown)
    return json_path, md_path


# -- figures ---------------------------------------------------------------------------------


def goals_met(figures: dict[str, Any], goals: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Whether each goal is met: ``{"max": x}``, ``{"min": x}``, or ``{"min_ratio": r,
    "of": other}`` (at least ``r`` times figure ``other`` of the same run); a figure that is
    missing meets nothing."""
    met: dict[str, bool] = {}
    for name, goal in goals.items():
        value = figures.get(name)
        if value is None:
            met[name] = False
        elif "max" in goal:
            met[name] = value <= goal["max"]
        elif "min" in goal:
            met[name] = value >= goal["min"]
        else:
            other = figures.get(goal["of"])
            met[name] = other is not None and value >= goal["min_ratio"] * other
    return met


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between the closest ranks.

    This is numpy's default (``method="linear"``): position ``(n - 1) * q / 100`` in the
    sorted values, so p50 of an even count is the mean of the middle two and p100 the maximum.
    """
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def status_counts(engine: Any, upto: int | None = None) -> dict[str, int]:
    """Outbox events per status (of those up to sequence ``upto``, if given)."""
    query = select(outbox_event.c.status, func.count()).group_by(outbox_event.c.status)
    if upto is not None:
        query = query.where(outbox_event.c.seq <= upto)
    with engine.connect() as conn:
        return {status: count for status, count in conn.execute(query)}


def max_seq(engine: Any) -> int:
    """The outbox's newest sequence number (0 when empty)."""
    with engine.connect() as conn:
        return conn.execute(select(func.max(outbox_event.c.seq))).scalar() or 0


def publish_latencies_ms(
    engine: Any, since: float, until: float | None = None, *, exclude_keys: tuple[str, ...] = ()
) -> list[float]:
    """Commit -> PUBLISHED (``last_publish_at - logged_at``) in ms of the published outbox
    events logged in [since, until) (epoch seconds), leaving out ``exclude_keys``' events.

    Both timestamps come from the outbox row, so this is the delay a consumer sees from the
    producer's commit to the last target's confirmation, with no clock of the benchmark's own.
    """
    query = select(outbox_event.c.logged_at, outbox_event.c.last_publish_at).where(
        outbox_event.c.status == "PUBLISHED"
    )
    if exclude_keys:
        query = query.where(outbox_event.c.partition_key.not_in(exclude_keys))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        (as_utc(done) - as_utc(logged)).total_seconds() * 1000
        for logged, done in rows
        if since <= as_utc(logged).timestamp()
        and (until is None or as_utc(logged).timestamp() < until)
    ]


# -- what was measured -----------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _java_version() -> str:
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        return (java.stderr or java.stdout).splitlines()[0].strip()
    except (OSError, IndexError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"


def machine_info(*, spark: bool = True) -> dict[str, Any]:
    """The machine and runtimes a report's figures come from; with ``spark`` also the Java
    and PySpark versions (left out where Spark plays no part, so PySpark is not imported)."""
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
    }
    if spark:
        import pyspark

        info["java"] = _java_version()
        info["pyspark"] = pyspark.__version__
    info["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    return info


def machine_text(machine: dict[str, Any]) -> str:
    """The hardware part of a report's machine line."""
    return f"{machine['cpu']}, {machine['cores']} cores, {machine['ram_gib']} GiB RAM"


def code_version() -> str:
    """The commit the benchmark ran against, and whether src/ differed from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%h %s"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return f"git {head}" + (" (src/ had uncommitted changes)" if dirty else " (src/ clean)")


# -- CPU -------------------------------------------------------------------------------------


def cpu_seconds(proc: psutil.Process) -> float:
    """User plus system CPU-s of one process; 0 once it is gone."""
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def cpu_share(cpu_s: float, wall_s: float) -> float:
    """CPU-s as a share of every core over ``wall_s``."""
    cores = os.cpu_count() or 1
    return cpu_s / (wall_s * cores) if wall_s else 0.0


async def wait_idle(proc: psutil.Process, *, max_cores: float, timeout: float) -> bool:
    """Wait until ``proc`` uses under ``max_cores`` cores over 0.5 s, so that work left over
    from one measure (a backlog, a dropped client) does not slow the next; False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds(proc)
        await asyncio.sleep(0.5)
        if cpu_seconds(proc) - before < max_cores * 0.5:
            return True
    return False


class MachineCpu:
    """The whole machine's CPU time between ``start`` (construction) and ``stop``.

    The benchmark's own CPU subtracted from the machine's busy time is what other processes
    took meanwhile: the figures of a phase that shared the cores are not an idle machine's.
    """

    def __init__(self) -> None:
        self.start = self.end = psutil.cpu_times()

    def stop(self) -> None:
        self.end = psutil.cpu_times()

    def busy_s(self) -> float:
        """CPU-s every core spent busy (steal not counted)."""
        return sum(
            getattr(self.end, f) - getattr(self.start, f)
            for f in _BUSY_FIELDS
            if hasattr(self.start, f)
        )

    def other_s(self, own_cpu_s: float) -> float:
        """CPU-s of every process but the benchmark's own (``own_cpu_s``)."""
        return max(0.0, self.busy_s() - own_cpu_s)

    def steal_s(self) -> float:
        """CPU-s the hypervisor gave to other guests."""
        return getattr(self.end, "steal", 0.0) - getattr(self.start, "steal", 0.0)


# -- process trees ---------------------------------------------------------------------------


class TreeMonitor:
    """Samples a process tree (root and every descendant): CPU seconds and PSS per kind.

    A Spark relay is many processes, so its cost is only seen summed over the tree. Kinds:
    the driver (root), the JVM, Python task workers (``pyspark.daemon pyspark.worker``: the
    read and write tasks) and the other Python workers Spark starts for data source planning,
    the streaming source and the commit. With ``baseline`` the CPU used before the first
    sample is not counted. CPU of a process that exits between two samples is counted up to
    its last sample only.
    """

    def __init__(self, root_pid: int, *, pss: bool = False, baseline: bool = True) -> None:
        self.root = psutil.Process(root_pid)
        self.pss = pss
        self.kinds: dict[int, str] = {}
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.peak = 0
        self.peak_parts: dict[str, int] = {}
        self.peak_counts: dict[str, int] = {}
        self.single_peak: dict[str, int] = defaultdict(int)
        self.machine = MachineCpu()
        self.samples = 0
        self.started = time.perf_counter()
        self.wall = 0.0
        self._baseline = baseline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sample()
        self._baseline = False

    def _kind(self, proc: psutil.Process) -> str:
        if proc.pid == self.root.pid:
            return "driver"
        name = proc.name()
        if "java" in name:
            return "JVM"
        if "python" not in name:
            return "other"
        if proc.cmdline()[-1:] == ["pyspark.worker"]:
            return "python task workers"
        return "python planning/commit workers"

    def _sample_process(
        self, proc: psutil.Process, parts: dict[str, int], counts: dict[str, int]
    ) -> int:
        """Record one process's CPU (and PSS into ``parts``); its PSS in bytes."""
        kind = self.kinds.get(proc.pid, "other")
        if kind == "other":  # spark-class is bash until it execs the JVM
            kind = self.kinds[proc.pid] = self._kind(proc)
        times = proc.cpu_times()
        cpu = times.user + times.system
        self.first.setdefault(proc.pid, cpu if self._baseline else 0.0)
        self.last[proc.pid] = cpu
        if not self.pss:
            return 0
        pss = proc.memory_full_info().pss
        parts[kind] += pss
        counts[kind] += 1
        self.single_peak[kind] = max(self.single_peak[kind], pss)
        return pss

    def sample(self) -> int:
        """Take one sample; returns the tree's PSS in bytes (0 without ``pss``)."""
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        parts: dict[str, int] = defaultdict(int)
        counts: dict[str, int] = defaultdict(int)
        for proc in procs:
            try:
                total += self._sample_process(proc, parts, counts)
            except psutil.Error:
                continue
        self.samples += 1
        if total > self.peak:
            self.peak, self.peak_parts, self.peak_counts = total, dict(parts), dict(counts)
        return total

    def start(self, interval: float = 0.25) -> TreeMonitor:
        def loop() -> None:
            while not self._stop.wait(interval):
                self.sample()

        self._thread = threading.Thread(target=loop, name="tree-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> TreeMonitor:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        self.wall = time.perf_counter() - self.started
        self.machine.stop()
        return self

    def foreign_cpu(self) -> tuple[float, float]:
        """CPU-s used by processes outside the tree meanwhile, and CPU-s stolen (steal)."""
        return self.machine.other_s(sum(self.cpu_by_kind().values())), self.machine.steal_s()

    def foreign_share(self) -> float:
        """The CPU of processes outside the tree as a share of every core."""
        return cpu_share(self.foreign_cpu()[0], self.wall)

    def cpu_by_kind(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for pid, last in self.last.items():
            out[self.kinds[pid]] += last - self.first[pid]
        return dict(out)

    def describe_cpu(self) -> str:
        cpu = self.cpu_by_kind()
        total = sum(cpu.values())
        cores = os.cpu_count() or 1
        parts = ", ".join(
            f"{k} {v:.1f} s" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 0.05
        )
        return (
            f"CPU used by the process tree over {self.wall:.1f} s wall: {parts}; total "
            f"{total:.1f} CPU-s = {cpu_share(total, self.wall):.0%} of {cores} cores"
        )
