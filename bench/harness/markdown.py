"""The Markdown pieces every report is written with: its heading (the command, when, how
long, the machine), tables and lists, so that the reports in ``bench/results/`` read alike."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from bench.harness.machine import machine_text, software_text

#: A table column's alignment: left, right or centred.
_ALIGN = {"l": "---", "r": "---:", "c": ":---:"}


def command(benchmark: str, *options: str) -> str:
    """How a benchmark is run from the checkout's root, with ``options``."""
    return " ".join([".venv/bin/python -m", f"bench.{benchmark}", *options])


def heading(
    title: str,
    run: str,
    machine: dict[str, Any],
    runtime_s: float,
    *,
    code: str | None = None,
    more: str = "",
) -> list[str]:
    """A report's first lines: its title, the command ``run`` and when it ran, for how long
    and on what code (if ``code``), and the machine (``more``: a sentence added to it)."""
    when = f"Run `{run}` on {machine['date']}, {runtime_s / 60:.1f} min"
    return [
        f"# {title}",
        "",
        when + (f"; {code}." if code else "."),
        "",
        f"Machine: {machine_text(machine)}; {software_text(machine)}." + more,
        "",
    ]


def row(cells: Iterable[str]) -> str:
    """One table row."""
    return f"| {' | '.join(cells)} |"


def table(header: Sequence[str], align: str, rows: Iterable[Sequence[str]]) -> list[str]:
    """A table: ``align`` has a letter per column (``l``, ``r`` or ``c``)."""
    assert len(align) == len(header)
    return [row(header), "|" + "|".join(_ALIGN[a] for a in align) + "|", *map(row, rows)]


def bullets(items: Iterable[str]) -> list[str]:
    """A list, one item a line."""
    return [f"- {item}" for item in items]


def section(title: str, lines: Iterable[str], level: int = 2) -> list[str]:
    """A titled section, followed by a blank line."""
    return [f"{'#' * level} {title}", "", *lines, ""]
