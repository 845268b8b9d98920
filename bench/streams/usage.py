"""The CPU of one measured run, split into the server, PostgreSQL, the clients and every other
process, and the report's row of cores per part with what bounds the run."""

from __future__ import annotations

from typing import Any

import psutil

from bench.harness.cpu import CpuWindow, children_cpu, cpu_seconds, postgres_cpu, tree_cpu
from bench.harness.report import Report
from bench.streams.workload import BOUND_SHARE


def measure_cpu(server_pid: int | None) -> CpuWindow:
    """CPU over one measured run: the server's process tree, PostgreSQL, the clients (the
    Node children waited for meanwhile, and this process) and every other process."""
    server = psutil.Process(server_pid) if server_pid else None
    me = psutil.Process()
    return CpuWindow(
        server=lambda: tree_cpu(server),
        db=postgres_cpu,
        node=children_cpu,
        bench=lambda: cpu_seconds(me),
    )


def bound_text(client_core: float, server_core: float, client: str) -> str:
    if client_core >= BOUND_SHARE:
        return f"{client} (CPU at {client_core:.0%} of a core)"
    if server_core >= BOUND_SHARE:
        return f"server CPU ({server_core:.0%} of a core)"
    return "neither CPU-bound (round trips, commits, waits)"


def record_cpu(
    report: Report,
    phase: str,
    usage: dict[str, float],
    window_s: float,
    client_cpu_s: float,
    client: str = "FutoIn client",
) -> dict[str, Any]:
    """One row of the CPU table: each part's cores over the client's measured window."""
    client_core = client_cpu_s / window_s
    server_core = usage["server_cpu_s"] / window_s
    row = {
        "phase": phase,
        "window_s": round(window_s, 3),
        "server_cores": round(server_core, 2),
        "postgres_cores": round(usage["db_cpu_s"] / window_s, 2),
        "client_cores": round(client_core, 2),
        "other_share": round(usage["other_share"], 3),
        "bound": bound_text(client_core, server_core, client),
    }
    report.cpu.append(row)
    return row
