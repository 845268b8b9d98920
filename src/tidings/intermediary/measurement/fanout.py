"""Measuring the fan-out tier: a simulation publisher, intermediaries and many subscribers in
other processes (the benchmark's and ``tidings fanout-demo``: one piece of code).

The **tier** is the publisher and the intermediaries. The publisher, a
:class:`.simulation.Simulation` ticking at ``tick_hz``, runs in the calling process and is
served over the wire by a :class:`.publisher.server.SimulationServer`; each of the
``intermediaries`` is an :class:`.transport.IntermediaryServer` in its own process
(:mod:`.intermediary_process`), subscribing upstream through a :class:`.feed.remote.RemoteFeed`, as
the patent's intermediaries are separate machines. Why processes: one Python process holds
one core at most (its interpreter lock); with the intermediaries in the publisher's process
the tier used 1.1 cores of 2 and its subscribers got 77-84 % of their asked rate while a
third of the machine stood idle. The **subscribers** run in ``processes`` child processes
(:mod:`.subscriber_process`), each holding many WebSocket connections, one subscriber each.

Where subscribers look: around ``hotspots`` places (viewers gather where something happens:
the patent's case, many subscribers wanting overlapping views), each a sphere of ``radius``
at a place drawn ``spread`` (normal) from its hotspot, or (``relative_share`` of them) around
the agent nearest that place, moving with it. The upstream saving is the views' overlap: the
tier's upstream over the direct bytes is about the union of the views over their sum.
Responsibility is by region: a hotspot belongs to one intermediary, and its subscribers
connect there.

Figures, over a window of ``duration_s`` after ``warmup_s``:

* ``delivered_updates_s``: frames received per second, all subscribers;
* ``staleness_p50_ms`` / ``p99``: receipt time less the frame's publisher tick time;
* ``min_rate_fraction``: the worst subscriber's frames per second (from its first frame in
  the window to its last) over its asked rate;
* ``upstream_bytes_s``: what the publisher sent the intermediaries (the batches as sent:
  40-byte header, ids int64, positions float64, deletions), against ``direct_bytes_s``:
  what the publisher would send if every subscriber connected to it directly, its own view
  each tick in the same encoding (from the view sizes the subscribers held);
  ``upstream_ratio_vs_direct`` is the first over the second;
* ``memory_per_subscriber_kib``: growth of the tier processes' USS (the memory they alone
  hold) from before the subscribers connected to the window's end, per subscriber.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import psutil

from tidings.errors import IntermediaryError
from tidings.intermediary.cluster import children
from tidings.intermediary.feed.wire import HEADER
from tidings.intermediary.publisher.server import SimulationServer
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.regions.geometry import Box

#: The intermediaries' round period: short rounds serve a subscriber soon after its epoch
#: arrives (a round with nobody due costs a few microseconds).
ROUND_S = 0.002
#: The most subscribers one round serves: a round holds the event loop, so the loop reads
#: and writes between rounds. Measured at 1,000 subscribers over three intermediaries
#: (400 each at most): 100 cost a few per cent of the asked rate in loop turns; 400 held
#: the loop so long that staleness p99 went past 200 ms; 200 kept both.
ROUND_BUDGET = 200
#: Seconds a subscriber process may take to connect and subscribe all its subscribers.
READY_TIMEOUT_S = 120.0


#: The longest results line a subscriber process may print (its staleness samples).
RESULTS_LINE_LIMIT = 256 * 1024 * 1024


@dataclass(frozen=True)
class FanoutConfig:
    """One measured run: sizes, rates and timings."""

    subscribers: int = 1000
    entities: int = 50_000
    tick_hz: float = 10.0
    rate_hz: float = 10.0
    intermediaries: int = 2
    processes: int = 10
    duration_s: float = 10.0
    warmup_s: float = 3.0
    world_size: float = 1000.0
    hotspots: int = 5
    radius: float = 20.0
    #: How far (standard deviation) a subscriber's place lies from its hotspot.
    spread: float = 10.0
    relative_share: float = 0.25
    max_speed: float = 5.0
    #: Upstream boxes are grown by this (claim 2's neighbourhood), so a moving view stays
    #: covered for a while instead of asking upstream again every epoch.
    upstream_margin: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("subscribers", "entities", "intermediaries", "processes", "hotspots"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise IntermediaryError(f"fanout: {name} must be an integer >= 1, not {value!r}")
        for name in ("tick_hz", "rate_hz", "duration_s", "world_size", "radius", "spread"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise IntermediaryError(f"fanout: {name} must be a number > 0, not {value!r}")
        if not 0 <= self.relative_share <= 1:
            raise IntermediaryError(
                f"fanout: relative_share must be in [0, 1], not {self.relative_share!r}"
            )


@dataclass(frozen=True)
class FanoutResult:
    """The figures of one run (see the module docstring)."""

    config: FanoutConfig
    window_s: float
    delivered_updates_s: float
    staleness_p50_ms: float
    staleness_p99_ms: float
    min_rate_fraction: float
    mean_rate_fraction: float
    upstream_bytes_s: float
    direct_bytes_s: float
    upstream_ratio_vs_direct: float
    memory_per_subscriber_kib: float
    tier_cpu_s: float
    subscribers_cpu_s: float
    disconnected: int
    staleness_ms: list[float]

    def figures(self) -> dict[str, Any]:
        """The result without the raw staleness samples (for a report)."""
        out = asdict(self)
        out.pop("staleness_ms")
        out["config"] = asdict(self.config)
        return out

    def holds(self, *, max_p99_ms: float = 200.0, min_fraction: float = 0.95) -> bool:
        """Whether the run met the goals (staleness p99 and every subscriber's rate)."""
        return (
            self.staleness_p99_ms <= max_p99_ms
            and self.min_rate_fraction >= min_fraction
            and self.disconnected == 0
        )


def plan_subscribers(
    config: FanoutConfig, sim: Simulation, urls: list[str]
) -> list[dict[str, Any]]:
    """Each subscriber's connection: its intermediary's URL and its region (see the module
    docstring), reproducible from ``config.seed``."""
    rng = np.random.default_rng(config.seed + 1)
    size = config.world_size
    margin = min(size / 4, 3 * config.radius)
    centres = rng.uniform(margin, size - margin, size=(config.hotspots, sim.dim))
    plans: list[dict[str, Any]] = []
    for i in range(config.subscribers):
        hotspot = i % config.hotspots
        place = np.clip(centres[hotspot] + rng.normal(0, config.spread, sim.dim), 0, size)
        if rng.random() < config.relative_share:
            agent = int(np.argmin(np.sum((sim.positions - place) ** 2, axis=1)))
            region = {
                "sphere": {"center": [0.0] * sim.dim, "radius": config.radius},
                "relative_to": agent,
            }
        else:
            region = {"sphere": {"center": place.tolist(), "radius": config.radius}}
        plans.append(
            {
                "url": urls[hotspot % len(urls)],
                "region": region,
                "rate_hz": config.rate_hz,
                "capabilities": {"float32": True},
            }
        )
    return plans


class Tier:
    """The simulation, served on this event loop, and its intermediaries, each in its own
    process (:mod:`.intermediary_process`) fed over the wire (:mod:`.feed.wire`)."""

    def __init__(self, config: FanoutConfig) -> None:
        self.config = config
        size = config.world_size
        self.world = Box((0.0, 0.0), (size, size))
        self.sim = Simulation(
            config.entities, self.world, max_speed=config.max_speed, seed=config.seed
        )
        self.publisher = SimulationServer(self.sim, config.tick_hz)
        self.nodes: list[asyncio.subprocess.Process] = []

    async def start(self) -> list[str]:
        """Start the publisher and the intermediary processes; the subscribers' URLs."""
        upstream = await self.publisher.start()
        plan = {
            "upstream": upstream,
            "world": [list(self.world.lo), list(self.world.hi)],
            "upstream_margin": self.config.upstream_margin,
            "max_connections": max(10_000, 2 * self.config.subscribers),
            "round_s": ROUND_S,
            "budget": ROUND_BUDGET,
        }
        urls = []
        for _ in range(self.config.intermediaries):
            node = await children.spawn(
                "tidings.intermediary.measurement.intermediary_process", plan
            )
            self.nodes.append(node)
            (port,) = await children.ready(node, "fanout: an intermediary", READY_TIMEOUT_S)
            urls.append(f"ws://127.0.0.1:{int(port)}/")
        return urls

    async def freeze(self) -> None:
        """Each intermediary's long-lived objects out of the cyclic collector's reach."""
        for node in self.nodes:
            assert node.stdin is not None and node.stdout is not None
            node.stdin.write(b"freeze\n")
            await node.stdin.drain()
            async with asyncio.timeout(READY_TIMEOUT_S):
                await node.stdout.readline()

    def processes(self) -> list[psutil.Process]:
        """This process (the publisher) and the intermediaries'."""
        return [psutil.Process(), *(psutil.Process(node.pid) for node in self.nodes)]

    def upstream_bytes(self) -> int:
        return self.publisher.bytes_sent

    async def aclose(self) -> None:
        for node in self.nodes:
            await children.end(node, kill=True)
        await self.publisher.aclose()


def _uss(processes: list[psutil.Process]) -> int:
    """The memory only these processes hold (unique set size: shared library pages, whose
    proportional share falls as other processes map them, left out)."""
    return sum(int(proc.memory_full_info().uss) for proc in processes)


async def _start_subscribers(
    plans: list[dict[str, Any]], processes: int, started: list[asyncio.subprocess.Process]
) -> None:
    """Start the subscriber processes into ``started`` (the caller's, so it ends even those
    started before one failed) and wait until each has subscribed everyone."""
    for part in range(processes):
        mine = plans[part::processes]
        if not mine:
            continue
        # The results line holds every frame's staleness: megabytes at full size.
        child = await children.spawn(
            "tidings.intermediary.measurement.subscriber_process",
            {"subscribers": mine},
            limit=RESULTS_LINE_LIMIT,
        )
        started.append(child)
    for child in started:
        await children.ready(child, "fanout: a subscriber process", READY_TIMEOUT_S)


def _cpu(pids: list[psutil.Process]) -> float:
    total = 0.0
    for proc in pids:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


async def run_fanout(
    config: FanoutConfig, *, window: Callable[[str], None] | None = None
) -> FanoutResult:
    """One measured run (see the module docstring). ``window`` is called with ``"start"``
    and ``"stop"`` at the measuring window's edges (e.g. to count the machine's CPU)."""
    tier = Tier(config)
    subscribers: list[asyncio.subprocess.Process] = []
    try:
        urls = await tier.start()
        tiered = tier.processes()
        await asyncio.sleep(2 / config.tick_hz)
        uss0 = _uss(tiered)
        plans = plan_subscribers(config, tier.sim, urls)
        await _start_subscribers(plans, config.processes, subscribers)
        procs = [psutil.Process(child.pid) for child in subscribers]
        await tier.freeze()
        await asyncio.sleep(config.warmup_s)
        t0 = time.time() + 0.2
        t1 = t0 + config.duration_s
        for child in subscribers:
            assert child.stdin is not None
            child.stdin.write(f"go {t0} {t1}\n".encode())
            await child.stdin.drain()
        await asyncio.sleep(max(0.0, t0 - time.time()))
        if window is not None:
            window("start")
        bytes0, own0, subs0 = tier.upstream_bytes(), _cpu(tiered), _cpu(procs)
        await asyncio.sleep(max(0.0, t1 - time.time()))
        bytes1, own1, subs1 = tier.upstream_bytes(), _cpu(tiered), _cpu(procs)
        if window is not None:
            window("stop")
        uss1 = _uss(tiered)
        results = []
        for child in subscribers:
            assert child.stdout is not None
            async with asyncio.timeout(READY_TIMEOUT_S):
                line = await child.stdout.readline()
            if not line:
                raise IntermediaryError(
                    f"fanout: subscriber process {child.pid} ended without its results"
                )
            results.append(json.loads(line))
    finally:
        for child in subscribers:
            await children.end(child, kill=True)
        await tier.aclose()
    return _figures(
        config, results, t1 - t0, bytes1 - bytes0, own1 - own0, subs1 - subs0, uss1 - uss0
    )


def _figures(
    config: FanoutConfig,
    results: list[dict[str, Any]],
    window_s: float,
    upstream_bytes: int,
    tier_cpu_s: float,
    subscribers_cpu_s: float,
    uss_growth: int,
) -> FanoutResult:
    frames = np.array([f for r in results for f in r["frames"]], dtype=np.float64)
    entities = np.array([e for r in results for e in r["view_entities"]], dtype=np.float64)
    staleness = [s for r in results for s in r["staleness_ms"]]
    spans = np.array([s for r in results for s in r["spans"]], dtype=np.float64)
    # A subscriber's rate: frames after its first one over the time from the first to the
    # last (the window's edges would cost up to a frame each); none or one frame: by count.
    timed = (frames >= 2) & (spans > 0)
    rates = (
        np.where(timed, (frames - 1) / np.where(timed, spans, 1.0), frames / window_s)
        / config.rate_hz
    )
    # The direct publisher sends each subscriber its view every tick in the feed's encoding
    # (a batch header, ids int64, positions float64), as the tier's upstream is counted.
    mean_view = np.divide(entities, frames, out=np.zeros_like(entities), where=frames > 0)
    direct = (float(mean_view.sum()) * (8 + 8 * 2) + HEADER.size * len(frames)) * config.tick_hz
    upstream = upstream_bytes / window_s
    p50, p99 = (
        (float(np.percentile(staleness, 50)), float(np.percentile(staleness, 99)))
        if staleness
        else (math.inf, math.inf)
    )
    return FanoutResult(
        config=config,
        window_s=window_s,
        delivered_updates_s=float(frames.sum()) / window_s,
        staleness_p50_ms=p50,
        staleness_p99_ms=p99,
        min_rate_fraction=float(rates.min()) if rates.size else 0.0,
        mean_rate_fraction=float(rates.mean()) if rates.size else 0.0,
        upstream_bytes_s=upstream,
        direct_bytes_s=direct,
        upstream_ratio_vs_direct=upstream / direct if direct else math.inf,
        memory_per_subscriber_kib=uss_growth / 1024 / config.subscribers,
        tier_cpu_s=tier_cpu_s,
        subscribers_cpu_s=subscribers_cpu_s,
        disconnected=sum(len(r["closed"]) for r in results),
        staleness_ms=staleness,
    )
