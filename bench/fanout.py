"""Benchmark of the intermediaries' fan-out to many subscribers in other processes.

A simulation publisher of 50,000 moving agents at 10 Hz, intermediaries, and 1,000
subscribers in separate processes.

Run ``.venv/bin/python -m bench.fanout [--quick]`` from the checkout. The measuring is
:func:`tidings.intermediary.measurement.fanout.run_fanout` (the same code ``tidings fanout-
demo`` runs; its docstring says what runs where and how each figure is taken). This script
runs it at the full size, records the CPU other processes (and other guests of the host, as
steal) took meanwhile (a loaded run is marked), then searches for the largest subscriber
count that still holds the goals (staleness p99 <= 200 ms and every subscriber at >= 95 % of
its asked rate, none disconnected): doubling from the full size while it holds, halving
while it does not, then bisection; a run that fails while others took over a quarter of the
cores is measured once more. It writes ``bench/results/fanout.json`` and
``bench/results/fanout.md``.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from typing import Any

from bench.harness.cpu import MachineCpu, cpu_share, loaded_note
from bench.harness.figures import goals_met
from bench.harness.machine import code_version, machine_info
from bench.harness.markdown import command, heading, table
from bench.harness.progress import runtime_s, say
from bench.harness.report import write_report
from bench.harness.sizes import Scale, arguments, mode
from tidings.intermediary.measurement.fanout import FanoutConfig, FanoutResult, run_fanout

#: Five subscriber processes of 200 connections each: measured at 1,000 against ten of 100,
#: the ten took more CPU (2.1-2.3 s against 1.6-1.9 s in the window, and the tier 15-16 s
#: against 13-15 s: more processes to schedule on two cores) and the worst subscriber got
#: 0.89-0.96 of its rate against 0.97-0.98.
SCALE = Scale(
    full=FanoutConfig(
        subscribers=1000, entities=50_000, processes=5, intermediaries=3, duration_s=10, warmup_s=3
    ),
    quick=FanoutConfig(
        subscribers=40, entities=2000, processes=2, intermediaries=2, duration_s=1.5, warmup_s=0.5
    ),
)
#: Runs of the search are shorter than the main one.
SEARCH_S = {"full": 5.0, "quick": 1.0}
#: The search's largest and smallest counts, and its budget of runs.
SEARCH_MAX = 16_000
SEARCH_MIN = 10
SEARCH_RUNS = {"full": 6, "quick": 2}
#: A search run that fails while other processes took more than this share of the cores is
#: measured once more (this machine is shared; one loaded window should not end the search).
RETRY_SHARE = 0.25
GOALS: dict[str, dict[str, Any]] = {
    "staleness_p99_ms": {"max": 200.0},
    "min_rate_fraction": {"min": 0.95},
    "upstream_ratio_vs_direct": {"max": 0.1},
}


async def measure(config: FanoutConfig) -> tuple[FanoutResult, float]:
    """One run and the share of the cores others (processes, steal) took in its window."""
    machine: list[MachineCpu] = []

    def window(edge: str) -> None:
        if edge == "start":
            machine.append(MachineCpu())
        else:
            machine[0].stop()

    result = await run_fanout(config, window=window)
    own = result.tier_cpu_s + result.subscribers_cpu_s
    # Other processes' CPU and the hypervisor's steal (other guests on the host: this VM's
    # processes cannot show it) both take cores from the run.
    cpu = machine[0]
    other = cpu_share(cpu.other_s(own) + cpu.steal_s(), result.window_s)
    say(
        f"{config.subscribers} subscribers: {result.delivered_updates_s:,.0f} updates/s, "
        f"staleness p50 {result.staleness_p50_ms:.0f} ms p99 {result.staleness_p99_ms:.0f} ms, "
        f"worst rate {result.min_rate_fraction:.0%}, upstream/direct "
        f"{result.upstream_ratio_vs_direct:.3f}, others and steal {other:.0%} of the cores"
        f" -> {'holds' if result.holds() else 'does not hold'}"
    )
    return result, other


async def search(base: FanoutConfig, first: FanoutResult, runs: int) -> tuple[int, list[dict]]:
    """The largest count that held, from the main run's outcome (see the module doc)."""
    tried: list[dict[str, Any]] = []
    held, failed = (base.subscribers, None) if first.holds() else (0, base.subscribers)
    for _ in range(runs):
        if failed is None:
            count = min(2 * held, SEARCH_MAX)
        elif held == 0:
            count = failed // 2
        else:
            count = (held + failed) // 2
        if count < SEARCH_MIN or count in (held, failed) or count > SEARCH_MAX:
            break
        config = replace(base, subscribers=count, processes=min(base.processes, count))
        result, other = await measure(config)
        if not result.holds() and other > RETRY_SHARE:
            say(f"others took {other:.0%} of the cores: measuring {count} once more")
            result, other = await measure(config)
        tried.append(
            {
                "subscribers": count,
                "holds": result.holds(),
                "staleness_p99_ms": round(result.staleness_p99_ms, 1),
                "min_rate_fraction": round(result.min_rate_fraction, 3),
                "other_share": round(other, 3),
            }
        )
        if result.holds():
            held = count
        else:
            failed = count
        if failed is not None and held and failed - held <= max(SEARCH_MIN, held // 8):
            break
    return held, tried


def figures(result: FanoutResult) -> dict[str, Any]:
    c = result.config
    return {
        "subscribers": c.subscribers,
        "entities": c.entities,
        "tick_hz": c.tick_hz,
        "delivered_updates_s": round(result.delivered_updates_s, 1),
        "staleness_p50_ms": round(result.staleness_p50_ms, 1),
        "staleness_p99_ms": round(result.staleness_p99_ms, 1),
        "min_rate_fraction": round(result.min_rate_fraction, 3),
        "mean_rate_fraction": round(result.mean_rate_fraction, 3),
        "upstream_bytes_s": round(result.upstream_bytes_s),
        "direct_bytes_s": round(result.direct_bytes_s),
        "upstream_ratio_vs_direct": round(result.upstream_ratio_vs_direct, 4),
        "memory_per_subscriber_kib": round(result.memory_per_subscriber_kib, 1),
        "disconnected": result.disconnected,
    }


def markdown(result: dict[str, Any], quick: bool) -> str:
    m = result["machine"]
    c = result["config"]
    rows = [
        ("delivered updates/s", f"{result['delivered_updates_s']:,.0f}", ""),
        ("staleness p50 (tick → receipt)", f"{result['staleness_p50_ms']:.0f} ms", ""),
        ("staleness p99", f"{result['staleness_p99_ms']:.0f} ms", "≤ 200 ms"),
        ("worst subscriber's rate ÷ asked", f"{result['min_rate_fraction']:.0%}", "≥ 95 %"),
        ("mean subscriber's rate ÷ asked", f"{result['mean_rate_fraction']:.0%}", ""),
        (
            "upstream bytes/s (through the tier)",
            f"{result['upstream_bytes_s']:,}",
            "",
        ),
        (
            "direct bytes/s (each subscriber from the publisher)",
            f"{result['direct_bytes_s']:,}",
            "",
        ),
        ("upstream ÷ direct", f"{result['upstream_ratio_vs_direct']:.3f}", "≤ 0.1"),
        (
            "memory per subscriber (tier USS growth)",
            f"{result['memory_per_subscriber_kib']} KiB",
            "",
        ),
        ("largest subscriber count that held", f"{result['max_subscribers_held']:,}", "10,000"),
    ]
    lines = [
        *heading(
            "Intermediaries: fan-out benchmark" + (" (--quick)" if quick else ""),
            command("fanout", *(["--quick"] if quick else [])),
            m,
            result["runtime_min"] * 60,
            code=result["code"],
        ),
        f"{c['subscribers']:,} subscribers in {c['processes']} processes, {c['entities']:,} "
        f"agents (2D, world {c['world_size']:g}², max speed {c['max_speed']:g}/s) at "
        f"{c['tick_hz']:g} Hz; {c['intermediaries']} intermediaries, each in its own process; "
        f"each subscriber a sphere of radius {c['radius']:g} about {c['spread']:g} from one of "
        f"{c['hotspots']} hotspots ({c['relative_share']:.0%} following an agent), asking "
        f"{c['rate_hz']:g} Hz, "
        f"float32. Window {c['duration_s']:g} s after {c['warmup_s']:g} s of warm-up.",
        "",
        *table(("figure", "value", "goal"), "lll", rows),
        "",
        f"CPU over the window: tier (publisher + intermediaries) {result['tier_cpu_s']:.1f} s, "
        f"subscriber processes {result['subscribers_cpu_s']:.1f} s, other processes and "
        f"steal {result['other_share']:.0%} of the cores.",
        "",
        "Search for the largest count that holds the goals:",
        "",
        *table(
            ("subscribers", "holds", "staleness p99 ms", "worst rate", "others' CPU and steal"),
            "lllll",
            [
                (
                    f"{t['subscribers']:,}",
                    "yes" if t["holds"] else "no",
                    f"{t['staleness_p99_ms']}",
                    f"{t['min_rate_fraction']:.0%}",
                    f"{t['other_share']:.0%}",
                )
                for t in result["search"]
            ],
        ),
        "",
        *(f"- {note}" for note in result["notes"]),
        "",
    ]
    return "\n".join(lines)


async def run(quick: bool) -> dict[str, Any]:
    size = mode(quick)
    base = SCALE.pick(quick)
    say(f"fan-out benchmark ({size}): {base}")
    main_result, other = await measure(base)
    search_base = replace(base, duration_s=SEARCH_S[size])
    held, tried = await search(search_base, main_result, SEARCH_RUNS[size])
    notes = [
        "staleness = the subscriber's receipt time - the publisher's wall-clock time of the "
        "tick the frame's state holds (frame version 2 carries it; same machine clock)",
        "direct = every subscriber's own view sent by the publisher each tick in the feed's "
        "encoding (40-byte header, ids int64, positions float64), as the batches to the "
        "intermediaries are counted",
    ]
    shares = {"the main window": other}
    shares |= {f"the search run of {t['subscribers']:,}": t["other_share"] for t in tried}
    loaded = loaded_note(shares)
    if loaded is not None:
        notes.append(f"LOADED RUN: {loaded}")
    if quick:
        notes.insert(0, "--quick run: small sizes, for checking the benchmark runs")
    met = goals_met(figures(main_result), GOALS)
    result: dict[str, Any] = {"machine": machine_info(spark=False), "code": code_version()}
    result |= figures(main_result)
    result |= {
        "max_subscribers_held": held,
        "goals": GOALS,
        "met": met,
        "loaded": loaded is not None,
        "other_share": round(other, 3),
        "tier_cpu_s": round(main_result.tier_cpu_s, 2),
        "subscribers_cpu_s": round(main_result.subscribers_cpu_s, 2),
        "config": main_result.figures()["config"],
        "search": tried,
        "notes": notes,
        "runtime_min": round(runtime_s() / 60, 2),
    }
    return result


def main() -> int:
    parser = arguments("bench.fanout", __doc__, "small sizes, seconds")
    args = parser.parse_args()
    result = asyncio.run(run(args.quick))
    paths = write_report("fanout", result, markdown(result, args.quick), args.results)
    say(f"done in {runtime_s() / 60:.1f} min; met: {result['met']}")
    say(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
