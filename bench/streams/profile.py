"""What bounds each of tidings' rates, and a ``node --cpu-prof`` profile of the drains the
FutoIn client bounds: self time by package and function, before and after the first event."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness.progress import say
from bench.harness.report import Report
from bench.streams.rates import Drain, drain_once, rate_key
from bench.streams.servers import Endpoint
from bench.streams.workload import BOUND_SHARE, RATE_MODES, StreamsSizes


def package_of(url: str) -> str:
    if "node_modules/" in url:
        rest = url.rsplit("node_modules/", 1)[1].split("/")
        return "/".join(rest[:2]) if rest[0].startswith("@") else rest[0]
    if url.startswith("node:") or not url:
        return "node"
    return Path(url).name


def profile_samples(prof_dir: Path) -> tuple[dict[int, Any], list[tuple[int, int, int]]]:
    """The newest .cpuprofile's nodes by id and its samples as (node id, time in us, us)."""
    files = sorted(prof_dir.glob("*.cpuprofile"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise RuntimeError(f"node --cpu-prof wrote no profile in {prof_dir}")
    data = json.loads(files[-1].read_text())
    samples, at = [], data["startTime"]
    for node_id, delta in zip(data["samples"], data["timeDeltas"], strict=False):
        at += delta
        samples.append((node_id, at, delta))
    return {node["id"]: node for node in data["nodes"]}, samples


def profile_summary(prof_dir: Path, start_us: int, first_us: int, top: int = 8) -> str:
    """Self time by package and the top functions of a profiled drain, apart from the
    client's start (after its modules are loaded) to the first event, and after it."""
    nodes, samples = profile_samples(prof_dir)
    parts: dict[str, tuple[Counter[str], Counter[str]]] = {
        "before": (Counter(), Counter()),
        "after": (Counter(), Counter()),
    }
    for node_id, at, delta in samples:
        frame = nodes[node_id]["callFrame"]
        name = frame["functionName"] or "(anonymous)"
        if name == "(idle)" or at < start_us:
            continue
        package = package_of(frame["url"])
        by_function, by_package = parts["after" if at >= first_us else "before"]
        by_function[f"{name} ({package}:{frame['lineNumber'] + 1})"] += delta
        by_package[package] += delta
    texts = []
    for part, (by_function, by_package) in parts.items():
        total = sum(by_package.values()) or 1
        functions = ", ".join(f"{k} {v / total:.0%}" for k, v in by_function.most_common(top))
        packages = ", ".join(f"{k} {v / total:.0%}" for k, v in by_package.most_common(6))
        texts.append(
            f"{part} the first event, {total / 1e6:.2f} CPU-s: by package {packages}; "
            f"top self time {functions}"
        )
    return "; ".join(texts)


def bound_note(key: str, drain: Drain) -> tuple[str, bool]:
    """What bounds one tidings drain, and whether the FutoIn client does (then it gets a
    profile): its start (before the first event) taking 30% of the drain or more at
    BOUND_SHARE of a core or more, or the delivery after it with the client that busy."""
    start_s = drain.first_ms / 1000
    start_core = drain.first_cpu_s / start_s if start_s else 0.0
    start_bound = start_core >= BOUND_SHARE and start_s >= 0.3 * drain.ms / 1000
    server_core = drain.steady_server_cpu_s / drain.steady_s
    if drain.steady_client_core >= BOUND_SHARE:
        delivery = "the FutoIn client bounds the delivery"
    elif server_core >= BOUND_SHARE:
        delivery = "tidings' server CPU (one Python process) bounds the delivery"
    else:
        delivery = "neither is CPU-bound there (round trips, database reads)"
    text = (
        f"{key} ({drain.rate:,.0f} ev/s): the FutoIn client's own start took "
        f"{drain.first_ms:,.0f} of {drain.ms:,.0f} ms, at {start_core:.0%} of a core (Node's "
        f"helper threads included){': the client bounds that part' if start_bound else ''}; "
        f"from the first to the last event ({drain.steady_rate:,.0f} ev/s) the server used "
        f"{server_core:.0%} of a core and the client {drain.steady_client_core:.0%}: {delivery}"
    )
    return text, start_bound or drain.steady_client_core >= BOUND_SHARE


def profile_bound_rates(
    servers: dict[str, tuple[Endpoint, Callable[[], int | None]]],
    medians: dict[str, Drain],
    markers: dict[str, int],
    sizes: StreamsSizes,
    work: Path,
    report: Report,
) -> None:
    """Say what bounds each tidings rate; run those the FutoIn client bounds once more
    under ``node --cpu-prof`` and summarise the profile."""
    ep, pid_of = servers["tidings"]
    for mode in RATE_MODES:
        key = rate_key(mode, "tidings")
        drain = medians.get(key)
        if drain is None:
            continue
        text, client_bound = bound_note(key, drain)
        if not client_bound:
            report.note(f"what bounds {text}")
            continue
        prof_dir = work / f"prof-{mode}"
        say(f"  the FutoIn client bounds tidings {mode}: profiling it")
        profiled = drain_once(ep, pid_of(), mode, 9, sizes, markers["tidings"], prof_dir)
        report.note(
            f"what bounds {text}. `node --cpu-prof` of one more drain ({profiled.rate:,.0f} "
            "ev/s under the profiler): "
            f"{profile_summary(prof_dir, profiled.start_us, profiled.first_us)}"
        )
