"""What both parts of the hostile benchmark share: the scales, one attack at a time measured
the same way (the bystanders' round trips, the attacked process's RSS growth, whether it
stayed alive, the refusals its metrics counted), and the report's table.

A row covers the attack from its start until 0.3 s after it ended. Growth is the process's
peak RSS (VmHWM, reset before the row) minus its RSS at the row's start. Refusals are the
change of every ``tidings_*refus*`` counter of the metrics endpoint during the row; None
(``n/a`` in the report) when the process has no metrics endpoint to read.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from bench.harness.progress import say
from bench.server.hostile import Bystander, _reset_peak, _status

#: (connections or requests per attack, seconds the slow and idle ones hold them).
#: Held over the streams' 10 s request head timeout, to show it.
SCALES = {"small": (200, 12.0), "full": (2000, 20.0)}
MIB = 1024 * 1024
#: Metric lines that count refusals.
REFUSALS = re.compile(r"^(tidings_\w*refus\w*)(\{[^}]*\})? (\S+)$", re.MULTILINE)
#: The baseline row: the bystanders alone for this long.
BASELINE_S = 2.0

Attack = Callable[[], Awaitable[str]]


async def refusals(metrics_url: str | None) -> dict[str, float] | None:
    """Every refusal counter at ``metrics_url`` (None: no endpoint, nothing counted)."""
    if metrics_url is None:
        return None
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(metrics_url)).text
    return {name + labels: float(value) for name, labels, value in REFUSALS.findall(text)}


def figures(bystander: Bystander, start: float, end: float) -> dict[str, Any]:
    """A bystander's round trips between the two times: count, p50, p99, worst, errors."""
    trips = bystander.round_trips(start, end)
    if not trips:
        return {"trips": 0, "worst_ms": round(bystander.worst_ms(start, end), 1)}
    return {
        "trips": len(trips),
        "p50_ms": round(trips[len(trips) // 2], 1),
        "p99_ms": round(trips[min(len(trips) - 1, int(len(trips) * 0.99))], 1),
        "worst_ms": round(bystander.worst_ms(start, end), 1),
        "errors": bystander.errors_between(start, end)[:3],
    }


def _changed(before: dict[str, float] | None, after: dict[str, float] | None) -> Any:
    if before is None or after is None:
        return None
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


async def run_attacks(
    pid: Callable[[], int],
    alive: Callable[[], bool],
    bystanders: Mapping[str, Bystander],
    attacks: Mapping[str, Attack],
    metrics_url: str | None,
    alive_key: str = "server_alive",
    fresh: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """The baseline row (``none``), then each attack in turn against the process whose pid
    ``pid()`` says; a row each. An attack that fails is a row saying how (the others still
    run). With ``fresh``, it is awaited before each attack (not the baseline) and gives the
    attack a process of its own, untouched by the attacks before (their connections, seats
    and throttled addresses gone); it returns once the bystanders are served again."""
    rows: dict[str, Any] = {}
    for name in ["none", *attacks]:
        if fresh is not None and name != "none":
            await fresh()
        if not alive():
            rows[name] = {"outcome": "not run: the attacked process is dead", alive_key: False}
            continue
        _reset_peak(pid())
        base = _status(pid())["VmRSS"]
        before = await refusals(metrics_url)
        start = time.time()
        if name == "none":
            await asyncio.sleep(BASELINE_S)
            outcome = "no attacker"
        else:
            try:
                outcome = await attacks[name]()
            except Exception as exc:
                outcome = f"the attack failed: {type(exc).__name__}: {exc}"[:300]
        await asyncio.sleep(0.3)
        end = time.time()
        for bystander in bystanders.values():
            await bystander.caught_up(end)
        living = alive()
        rows[name] = {
            "outcome": outcome,
            "seconds": round(end - start, 1),
            "rss_growth_mib": round((_status(pid())["VmHWM"] - base) / MIB, 1) if living else None,
            "refusals": _changed(before, await refusals(metrics_url)) if living else None,
            alive_key: living,
            **{k: figures(b, start, end) for k, b in bystanders.items()},
        }
        say(f"hostile {name}: {rows[name]}")
        await asyncio.sleep(1)
    return rows


def _trips(row: dict[str, Any]) -> str:
    cell = f"{row.get('p50_ms', '-')} / {row.get('p99_ms', '-')} / {row['worst_ms']}"
    return cell + (f" (errors: {row['errors']})" if row.get("errors") else "")


def attack_table(
    rows: Mapping[str, Any],
    what: Mapping[str, str],
    bystanders: list[str],
    alive_key: str = "server_alive",
) -> list[str]:
    """The report's table: a line per attack (``what`` says what its attacker does)."""
    head = " | ".join(f"{name} p50 / p99 / worst" for name in bystanders)
    lines = [
        f"| attack | what | outcome | {head} | growth MiB | alive | refusals counted |",
        "|---|---|---|" + "---:|" * len(bystanders) + "---:|---|---|",
    ]
    for name, row in rows.items():
        cells = [_trips(row[k]) if k in row else "-" for k in bystanders]
        counted = row.get("refusals")
        shown = (
            "n/a"
            if counted is None
            else ", ".join(f"`{k}` +{v:g}" for k, v in counted.items()) or "-"
        )
        alive = "yes" if row.get(alive_key) else "**no**"
        lines.append(
            f"| {name} | {what.get(name, 'bystanders alone')} | {row['outcome']} | "
            f"{' | '.join(cells)} | {row.get('rss_growth_mib', '-')} | {alive} | {shown} |"
        )
    return lines
