"""The machine, runtimes and code a report's figures come from, recorded in every report.

A figure means little without the cores, memory and versions it was measured on, and the
commit measured (and whether ``src/`` differed from it).
"""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from bench.harness.paths import REPO


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def first_line(*command: str) -> str:
    """The first line ``command`` prints (on its output, else its error output): a tool's
    version; ``unknown (why)`` if it cannot run."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip().splitlines()[0]
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

        # Java prints its version on its error output.
        info["java"] = first_line("java", "-version")
        info["pyspark"] = pyspark.__version__
    info["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    return info


def machine_text(machine: dict[str, Any]) -> str:
    """The hardware part of a report's machine line."""
    return f"{machine['cpu']}, {machine['cores']} cores, {machine['ram_gib']} GiB RAM"


#: The runtimes a report may name (keys of its machine description), in the order shown.
_SOFTWARE = (
    ("os", "{}"),
    ("python", "Python {}"),
    ("java", "{}"),
    ("pyspark", "PySpark {}"),
    ("node", "Node {}"),
    ("postgresql", "PostgreSQL {}"),
    ("nats_server", "nats-server {}"),
    ("hat_event", "hat-event {}"),
)


def software_text(machine: dict[str, Any]) -> str:
    """The runtimes part of a report's machine line: those its machine description holds."""
    return ", ".join(shown.format(machine[key]) for key, shown in _SOFTWARE if key in machine)


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
