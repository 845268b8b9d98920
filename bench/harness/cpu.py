"""The CPU a benchmark's parts used, and what every other process took meanwhile.

A figure measured while other work shared the cores is not an idle machine's: every report
counts the machine's busy time over a phase, subtracts the CPU of the parts it measured (a
server, a client, the benchmark itself, a database) and notes a phase whose other processes
took more than :data:`LOADED_SHARE` of the cores.
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
import time
from collections.abc import Callable

import psutil

#: A phase whose other processes used more than this share of the cores gets a note: its
#: figures are lower or slower than on an idle machine.
LOADED_SHARE = 0.1
#: Fields of ``psutil.cpu_times()`` that count as a core being busy (steal is reported apart).
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")


def cpu_seconds(proc: psutil.Process) -> float:
    """User plus system CPU-s of one process; 0 once it is gone."""
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def tree_cpu(proc: psutil.Process | None) -> float:
    """CPU-s of a process and its descendants (0 for None)."""
    if proc is None:
        return 0.0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0
    return sum(cpu_seconds(p) for p in procs)


def postgres_cpu() -> dict[int, float]:
    """CPU-s of each live process of the PostgreSQL server, by pid (taken before a
    benchmark's connections close, so that their backends are still counted)."""
    out = {}
    for proc in psutil.process_iter(["name"]):
        if (proc.info["name"] or "").startswith("postgres"):
            out[proc.pid] = cpu_seconds(proc)
    return out


def children_cpu() -> float:
    """CPU-s of this process's children that have been waited for (e.g. Node clients)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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


#: How a part's CPU is read: CPU-s so far, or CPU-s so far per process (a process that
#: appears meanwhile counts from zero, one that exits no longer counts).
CpuReader = Callable[[], float | dict[int, float]]


def _used(before: float | dict[int, float], now: float | dict[int, float]) -> float:
    if isinstance(now, dict):
        assert isinstance(before, dict)
        used = sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items())
    else:
        assert isinstance(before, float | int)
        used = now - before
    return max(used, 0.0)


class CpuWindow:
    """The CPU each named part used between construction and :meth:`stop`, and what every
    other process on the machine took meanwhile.

    ``CpuWindow(server=..., client=...)``: each part is a :data:`CpuReader`.
    """

    def __init__(self, **parts: CpuReader) -> None:
        self._parts = parts
        self._before = {name: read() for name, read in parts.items()}
        self._machine = MachineCpu()
        self._started = time.perf_counter()

    def stop(self) -> dict[str, float]:
        """``wall_s``, ``<part>_cpu_s`` of each part, and the other processes' CPU-s
        (``other_cpu_s``) and share of every core (``other_share``)."""
        wall = time.perf_counter() - self._started
        used = {
            f"{name}_cpu_s": _used(self._before[name], read()) for name, read in self._parts.items()
        }
        self._machine.stop()
        other = self._machine.other_s(sum(used.values()))
        return {
            "wall_s": wall,
            **used,
            "other_cpu_s": other,
            "other_share": cpu_share(other, wall),
        }


class CpuSampler:
    """One process's CPU-s sampled every few ms in a thread, to tell the CPU it used
    between two moments (epoch seconds; the kernel counts CPU in 10 ms ticks)."""

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.proc = psutil.Process(pid)
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), cpu_seconds(self.proc)))
            self._stop.wait(self.interval)

    def stop(self) -> CpuSampler:
        self._stop.set()
        self._thread.join()
        return self

    def at(self, when: float) -> float:
        before = [cpu for t, cpu in self.samples if t <= when]
        return before[-1] if before else (self.samples[0][1] if self.samples else 0.0)

    def between(self, start: float, end: float) -> float:
        return self.at(end) - self.at(start)


def loaded_note(shares: dict[str, float]) -> str | None:
    """The report's note on the phases (name -> other processes' share of the cores) that
    shared the machine with more than :data:`LOADED_SHARE` of other work; None if none did."""
    loaded = {name: share for name, share in shares.items() if share > LOADED_SHARE}
    if not loaded:
        return None
    names = ", ".join(f"{name} {share:.0%}" for name, share in loaded.items())
    return (
        f"other processes used over {LOADED_SHARE:.0%} of the cores during: {names}; "
        "those figures are lower/slower than on an idle machine"
    )
