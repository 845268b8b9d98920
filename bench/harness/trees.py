"""A process tree's CPU and memory, sampled over time in a thread.

A Spark relay is many processes (driver, JVM, Python workers) that come and go, so its cost
is only seen summed over the tree, sample by sample; the machine's busy time over the same
window gives what processes outside the tree took meanwhile.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict

import psutil

from bench.harness.cpu import MachineCpu, cpu_share


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
