"""A benchmark's report: its figures, notes and details, its phases, and its two files.

Every benchmark collects its figures in a :class:`Report` and writes ``results/<name>.json``
(for comparing runs) and ``results/<name>.md`` (for reading) with :func:`write_report`.
A phase that fails is noted and the run goes on (:func:`attempt`); :func:`measured` also
notes the CPU other processes took during the phase.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.harness.cpu import cpu_share, loaded_note
from bench.harness.paths import RESULTS
from bench.harness.progress import say
from bench.harness.trees import TreeMonitor

T = TypeVar("T")


@dataclass
class Report:
    """The figures, plus free-text notes, detail per section and rows of CPU use for the
    Markdown report."""

    figures: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    details: dict[str, list[str]] = field(default_factory=dict)
    cpu: list[dict[str, Any]] = field(default_factory=list)
    #: CPU-s that processes outside the benchmark's tree spent on the current phase's own
    #: workload (a PostgreSQL server it drives): not load from others (see :func:`measured`).
    workload_cpu: float = 0.0

    def note(self, text: str) -> None:
        self.notes.append(text)
        say(f"note: {text}")

    def detail(self, section: str, text: str) -> None:
        self.details.setdefault(section, []).append(text)


def attempt(name: str, fn: Callable[[], T], report: Report) -> T | None:
    """Run one phase, noting a failure instead of ending the run; its result, None if it
    failed."""
    say(f"{name} ...")
    try:
        return fn()
    except Exception as exc:
        traceback.print_exc()
        report.note(f"{name} failed: {type(exc).__name__}: {exc}")
        return None


def measured(name: str, fn: Callable[[], T], report: Report) -> T | None:
    """:func:`attempt`, with the CPU other processes used meanwhile (the ``load`` detail):
    a phase that shared the cores gets a note saying so."""
    monitor = TreeMonitor(os.getpid()).start(1.0)
    report.workload_cpu = 0.0
    try:
        return attempt(name, fn, report)
    finally:
        monitor.stop()
        foreign, steal = monitor.foreign_cpu()
        foreign = max(0.0, foreign - report.workload_cpu)
        cores = os.cpu_count() or 1
        share = cpu_share(foreign, monitor.wall)
        text = (
            f"{name}: other processes on the machine used {foreign:.1f} CPU-s "
            f"({share:.0%} of {cores} cores) over its {monitor.wall:.0f} s; steal {steal:.1f} s"
        )
        if report.workload_cpu:
            text += f" (not counting {report.workload_cpu:.1f} CPU-s of the phase's own database)"
        say(f"  {text}")
        report.detail("load", text)
        loaded = loaded_note({name: share})
        if loaded is not None:
            report.note(loaded)


def write_report(
    name: str, result: dict[str, Any], markdown: str, folder: Path = RESULTS
) -> tuple[Path, Path]:
    """Write ``results/<name>.json`` (for comparing runs) and ``results/<name>.md`` (for
    reading, and the documentation's figures), or into ``folder``; returns both paths."""
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / f"{name}.json", folder / f"{name}.md"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    md_path.write_text(markdown)
    return json_path, md_path
