"""One server under test (hat's, tidings' on SQLite or PostgreSQL, or the floor) in a
subprocess of its own, and one server's run: its figures, and the CPU the server, the client
and every other process used in each phase (a ratio is only fair if neither side was starved
of cores)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hat.event.common as hc
import psutil

from bench.harness.cpu import CpuWindow, cpu_seconds, wait_idle
from bench.harness.databases import scratch_database
from bench.harness.processes import ServerProcess, bench_env, free_port, local_address
from bench.harness.progress import say
from bench.server.workload import PG_KINDS, STORE_FLOOR_KINDS, is_floor


class BenchServer:
    """One server (``hat`` or ``tidings``) on a free port in a fresh temporary directory,
    with what the benchmark asks of it besides starting and stopping: its CPU time and the
    problems in its log."""

    def __init__(self, kind: str, keep: bool) -> None:
        self.kind = kind
        self.keep = keep
        #: What stop() undoes besides the process (the PostgreSQL kind's scratch database).
        self._cleanup = contextlib.ExitStack()
        work = Path(tempfile.mkdtemp(prefix=f"tidings-bench-{kind}-"))
        ports = {"eventer": free_port()}
        if is_floor(kind):
            config: dict[str, Any] = {"address": local_address(ports["eventer"])}
            if kind in STORE_FLOOR_KINDS:
                config["store"] = "periodic" if kind.endswith("_periodic") else "commit"
            floor = [sys.executable, "-m", "bench.server.floor"]
            self.process = ServerProcess(floor, work, config, ports, env=bench_env())
        elif kind == "hat":
            # The hostile phase stores a few hundred thousand events: a map of 1 GiB.
            self.process = ServerProcess.hat_event(work, 1, ports, max_db_size=1 << 30)
        else:
            backend = {"module": "tidings.server.backends.sqlite", "db_path": "ev.db"}
            if kind in PG_KINDS:
                # One database per server: they all run at once.
                url = self._cleanup.enter_context(scratch_database(f"tidings_bench_{kind}"))
                backend = {"module": "tidings.server.backends.postgresql", "url": url}
            if kind.endswith("_periodic"):
                backend |= {"durability": "periodic", "flush_period": 1}
            self.process = ServerProcess.tidings(work, 1, ports, backend=backend)
        self.port = self.process.port
        self.address = self.process.eventer
        self.ps: psutil.Process | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines)

    def log_problems(self, lines: int = 3) -> str:
        """The last warnings and errors in the server's log."""
        found = [
            line
            for line in self.log_tail(200).splitlines()
            if any(w in line.lower() for w in ("warning", "error", "exception"))
        ]
        return " | ".join(found[-lines:])

    async def start(self, timeout: float = 60.0) -> None:
        say(f"[{self.kind}] starting {self.process.config} in {self.process.workdir}")
        started = time.perf_counter()
        await asyncio.to_thread(self.process.start, timeout)
        assert self.proc is not None
        self.ps = psutil.Process(self.proc.pid)
        say(f"[{self.kind}] listening on {self.port} after {time.perf_counter() - started:.1f} s")

    def cpu_seconds(self) -> float:
        return 0.0 if self.ps is None else cpu_seconds(self.ps)

    def stop(self) -> None:
        self.process.stop(30)
        self._cleanup.close()
        if self.proc is not None:
            say(f"[{self.kind}] stopped (exit code {self.proc.returncode})")
        if self.keep:
            say(f"[{self.kind}] work dir kept: {self.process.workdir}")
        else:
            shutil.rmtree(self.process.workdir, ignore_errors=True)


@dataclass
class Run:
    """The figures of one server, plus CPU use per phase."""

    kind: str
    server: BenchServer
    figures: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    last_event: hc.Event | None = None  # newest event the benchmark registered
    errors: dict[str, str] = field(default_factory=dict)  # step -> what went wrong
    hostile: dict[str, dict[str, Any]] = field(default_factory=dict)  # row -> figures

    async def phase(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body``, recording the CPU the server, this client and every other process
        used meanwhile: a ratio is only fair if neither side was starved of cores."""
        me = psutil.Process()
        window = CpuWindow(server=self.server.cpu_seconds, client=lambda: cpu_seconds(me))
        await body()
        used = window.stop()
        keys = ("wall_s", "server_cpu_s", "client_cpu_s", "other_cpu_s")
        self.cpu[name] = {key: round(used[key], 2) for key in keys}
        say(
            f"[{self.kind}]   {name}: {used['wall_s']:.1f} s wall, server "
            f"{used['server_cpu_s']:.1f} CPU-s, client {used['client_cpu_s']:.1f} CPU-s, "
            f"other processes {used['other_cpu_s']:.1f} CPU-s"
        )

    def record(self, name: str, value: float) -> None:
        self.figures[name] = round(value, 3 if value < 100 else 1)
        say(f"[{self.kind}]   {name} = {self.figures[name]:,}")


async def settle(server: BenchServer, timeout: float = 120.0) -> None:
    """Wait until the server is idle (under 10% of a core for 0.5 s), e.g. still working off
    a dropped client's backlog, so that it does not slow the next measure."""
    if server.ps is None or not await wait_idle(server.ps, max_cores=0.1, timeout=timeout):
        say(f"[{server.kind}] still busy after {timeout:g} s")
