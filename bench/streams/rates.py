"""Part (a)'s rates: a backlog drained by a ReliableReceiver (push), a PollFace loop and LIVE
polls, on each server, runs interleaved; the median run of each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.harness.progress import say
from bench.harness.report import Report
from bench.streams.futoin_client import node_client, rate_options
from bench.streams.servers import Endpoint
from bench.streams.usage import record_cpu
from bench.streams.workload import RATE_MODES, StreamsSizes


@dataclass
class Drain:
    count: int
    ms: float
    first_ms: float
    client_cpu_s: float
    first_cpu_s: float
    first_us: int
    start_us: int
    usage: dict[str, float]
    steady_server_cpu_s: float

    @property
    def rate(self) -> float:
        """Events / (client start to last event): what a consumer starting afresh gets."""
        return self.count / (self.ms / 1000)

    @property
    def steady_s(self) -> float:
        return max((self.ms - self.first_ms) / 1000, 1e-3)

    @property
    def steady_rate(self) -> float:
        """Events after the first / (first to last event): the delivery rate itself."""
        return (self.count - 1) / self.steady_s

    @property
    def steady_client_core(self) -> float:
        return (self.client_cpu_s - self.first_cpu_s) / self.steady_s


def drain_once(
    ep: Endpoint,
    pid: int | None,
    mode: str,
    run: int,
    sizes: StreamsSizes,
    marker: int,
    prof_dir: Path | None = None,
) -> Drain:
    options = rate_options(ep, mode, run, sizes.backlog, marker)
    result = node_client(options, pid, timeout=180, prof_dir=prof_dir)
    done = result.done
    if done is None:
        raise RuntimeError(
            f"{ep.name} {mode}: the FutoIn client did not finish: {result.problem()}"
        )
    start = done["start_ms"] / 1000
    first, last = start + (done["first_ms"] or 0) / 1000, start + done["ms"] / 1000
    return Drain(
        options["count"],
        done["ms"],
        done["first_ms"] or 0.0,
        done["cpu_ms"] / 1000,
        (done["first_cpu_ms"] or 0.0) / 1000,
        done["first_us"] or 0,
        done["start_us"],
        result.usage,
        result.sampler.between(first, last) if result.sampler else 0.0,
    )


def drain_text(drain: Drain) -> str:
    return (
        f"{drain.rate:,.0f} ev/s ({drain.ms:,.0f} ms, first event at {drain.first_ms:,.0f} ms, "
        f"{drain.steady_rate:,.0f} ev/s after it with the client at "
        f"{drain.steady_client_core:.0%} of a core)"
    )


def phase_rates(
    servers: dict[str, tuple[Endpoint, Callable[[], int | None]]],
    markers: dict[str, int],
    sizes: StreamsSizes,
    report: Report,
) -> dict[str, Drain]:
    """Each rate on each server, runs interleaved (tidings, FutoIn, tidings, ...); the
    median run of each."""
    medians: dict[str, Drain] = {}
    for mode in [*RATE_MODES, "reliable_poll_http"]:
        for name, (ep, pid_of) in servers.items():
            if mode == "reliable_poll_http":
                if name != "tidings":
                    continue
                ep = Endpoint(ep.name, ep.push_url, "http" + ep.poll_url[2:], "1.1", ep.gen_url)
            drains = []
            for run in range(1, sizes.runs + 1):
                drains.append(drain_once(ep, pid_of(), mode, run, sizes, markers[name]))
                say(f"  {name} {mode} run {run}: {drain_text(drains[-1])}")
            key = rate_key(mode, name)
            medians[key] = record_rate(report, key, drains, transport(mode, ep))
    return medians


def record_rate(report: Report, key: str, drains: list[Drain], how: str) -> Drain:
    """The median run's figures (by rate): the rate, the rate after the first event, and
    the CPU over the first to last event (the server's whole-run CPU divided by that
    window: an upper bound)."""
    median = sorted(drains, key=lambda d: d.rate)[len(drains) // 2]
    report.figures[key] = round(median.rate)
    report.figures[f"{key}_after_first_event"] = round(median.steady_rate)
    report.detail("rates", f"{key}: runs {', '.join(drain_text(d) for d in drains)}; {how}")
    client_s = median.client_cpu_s - median.first_cpu_s
    usage = median.usage | {"server_cpu_s": median.steady_server_cpu_s}
    record_cpu(report, key, usage, median.steady_s, client_s)
    return median


def rate_key(mode: str, name: str) -> str:
    if mode == "reliable_poll_http":
        return "reliable_poll_ev_s_tidings_http"
    return f"{mode}_ev_s_{name}"


def transport(mode: str, ep: Endpoint) -> str:
    if mode == "reliable_push":
        return f"ReliableReceiver on {ep.push_url.split('//')[0]}//"
    what = "LIVE polls" if mode == "live" else "PollFace loop"
    return f"{what} on {ep.poll_url.split('//')[0]}// at {ep.poll_version}"
