"""Part (a)'s latency: generator to consumer at a paced rate through the FutoIn client, push
and poll, on each server, once more at a lower rate and with tidings on SQLite."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.figures import percentile
from bench.harness.progress import say
from bench.harness.report import Report
from bench.streams.futoin_client import node_client
from bench.streams.servers import Endpoint, running, tidings_server
from bench.streams.usage import record_cpu
from bench.streams.workload import (
    CREDS,
    FTN18_TYPE,
    LATENCY_WAIT_S,
    LOW_RATE,
    POLL_IDLE_MS,
    RATE,
    StreamsSizes,
)


@dataclass
class Latency:
    p50: float
    p99: float
    maximum: float
    missing: int
    max_lag_ms: float
    text: str
    #: p99 of latency less the event's own addEvent round trip (what delivery adds)
    delivery_p99: float = 0.0
    #: p99 of addEvent's round trip
    rtt_p99: float = 0.0


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"p50 {percentile(values, 50):,.1f} / p99 {percentile(values, 99):,.1f} ms"


def latency_options(ep: Endpoint, consumer: str, rate: int, sizes: StreamsSizes) -> dict[str, Any]:
    return {
        "mode": "latency",
        "consumer": consumer,
        "url": ep.poll_url,
        "version": ep.poll_version,
        "push_url": ep.push_url,
        "gen_url": ep.gen_url,
        "creds": CREDS,
        "component": f"LAT{consumer.upper()}{rate}",
        "type": FTN18_TYPE,
        "rate": rate,
        "seconds": sizes.latency_s,
        "wait_s": LATENCY_WAIT_S,
        "idle_ms": POLL_IDLE_MS,
    }


def latency_run(
    ep: Endpoint, pid: int | None, consumer: str, rate: int, sizes: StreamsSizes, report: Report
) -> Latency:
    """One latency load through the FutoIn client (one generator connection)."""
    timeout = sizes.latency_s + LATENCY_WAIT_S + 30
    result = node_client(latency_options(ep, consumer, rate, sizes), pid, timeout)
    line = result.last("latencies")
    if line is None:
        raise RuntimeError(f"{ep.name} latency ({consumer}): no result: {result.problem()}")
    skip = int(sizes.warmup_s * rate)
    pairs = list(zip(line["latencies"][skip:], line["gen_rtt"][skip:], strict=True))
    kept = [lat for lat, _ in pairs if lat is not None]
    if not kept:
        raise RuntimeError(f"{ep.name} latency ({consumer}): no event arrived")
    missing = len(pairs) - len(kept)
    # An event still missing when the client gave up counts as its wait: a lower bound.
    kept += [(sizes.latency_s + LATENCY_WAIT_S) * 1000] * missing
    rtt = [r for _, r in pairs if r is not None]
    beyond = [lat - r for lat, r in pairs if lat is not None and r is not None]
    row = record_cpu(
        report,
        f"latency {rate}/s {ep.name} {consumer}",
        result.usage,
        result.usage["wall_s"],
        line["cpu_ms"] / 1000,
    )
    lat = Latency(
        percentile(kept, 50),
        percentile(kept, 99),
        max(kept),
        missing,
        line["max_lag_ms"],
        "",
        percentile(beyond, 99) if beyond else 0.0,
        percentile(rtt, 99) if rtt else 0.0,
    )
    lat.text = (
        f"{ep.name} {consumer} at {rate} ev/s offered: p50 {lat.p50:,.1f} ms, p99 "
        f"{lat.p99:,.1f} ms, max {lat.maximum:,.0f} ms over {len(kept):,} events ({missing} "
        f"missing after the wait, counted as it; {line['gen_errors']} addEvent errors, "
        f"generator's worst lateness "
        f"{lat.max_lag_ms:,.0f} ms); addEvent round trip {spread(rtt)}; latency less the "
        f"event's addEvent round trip {spread(beyond)}; server {row['server_cores']:.0%} of a "
        f"core, client {row['client_cores']:.0%}"
    )
    return lat


def phase_latency(
    servers: dict[str, tuple[Endpoint, Callable[[], int | None]]],
    sizes: StreamsSizes,
    report: Report,
) -> None:
    """Latency at RATE through one GenFace connection (as a user's generator has it), push
    and poll; the worse of the two per server is the figure."""
    for name, (ep, pid_of) in servers.items():
        results = {}
        for consumer in ("push", "poll"):
            lat = latency_run(ep, pid_of(), consumer, RATE, sizes, report)
            results[consumer] = lat
            say(f"  {lat.text}")
            report.detail("latency", lat.text)
            report.figures[f"latency_{consumer}_p50_ms_{name}"] = round(lat.p50, 2)
            report.figures[f"latency_{consumer}_p99_ms_{name}"] = round(lat.p99, 2)
            delivery = f"latency_{consumer}_delivery_p99_ms_{name}"
            report.figures[delivery] = round(lat.delivery_p99, 2)
            report.figures[f"latency_{consumer}_addevent_p99_ms_{name}"] = round(lat.rtt_p99, 2)
        worse = max(results.values(), key=lambda lat: lat.p99)
        report.figures[f"latency_p50_ms_{name}"] = round(worse.p50, 2)
        report.figures[f"latency_p99_ms_{name}"] = round(worse.p99, 2)


def latency_note(report: Report) -> None:
    """When tidings misses the latency goal: how much is addEvent's round trip (storing the
    event) and how much delivery after it, with the server's CPU meanwhile."""
    f = report.figures
    total = f.get("latency_p99_ms_tidings")
    if total is None or total <= 20:
        return
    parts = []
    for consumer in ("push", "poll"):
        rtt = f.get(f"latency_{consumer}_addevent_p99_ms_tidings")
        delivery = f.get(f"latency_{consumer}_delivery_p99_ms_tidings")
        cpu = [r for r in report.cpu if r["phase"] == f"latency {RATE}/s tidings {consumer}"]
        if rtt is None or delivery is None or not cpu:
            continue
        parts.append(
            f"{consumer}: addEvent's round trip p99 {rtt:,.1f} ms, delivery after the reply "
            f"p99 {delivery:,.1f} ms, server at {cpu[-1]['server_cores']:.0%} of a core"
        )
    report.note(
        f"tidings' latency at {RATE} ev/s (p99 {total:,.1f} ms, goal 20) splits into the "
        "generator's addEvent round trip (the event stored: a group commit in PostgreSQL "
        "through the server's single write thread) and delivery once stored: " + "; ".join(parts)
    )


def phase_latency_low(
    servers: dict[str, tuple[Endpoint, Callable[[], int | None]]],
    sizes: StreamsSizes,
    report: Report,
) -> None:
    """The same at LOW_RATE, under what one GenFace connection to tidings takes."""
    for name, (ep, pid_of) in servers.items():
        for consumer in ("push", "poll"):
            lat = latency_run(ep, pid_of(), consumer, LOW_RATE, sizes, report)
            say(f"  {lat.text}")
            report.detail("latency at a lower rate", lat.text)
            report.figures[f"latency_{consumer}_p99_ms_{name}_at_{LOW_RATE}"] = round(lat.p99, 2)


def phase_latency_sqlite(work: Path, sizes: StreamsSizes, report: Report) -> None:
    """The latency once more with tidings on its embedded default, a SQLite file (no
    FutoIn equivalent): what a commit costs there against PostgreSQL's."""
    server, ep = tidings_server(work, f"sqlite:///{work / 'sqlite' / 'events.db'}")
    with running(server):
        results = {}
        for consumer in ("push", "poll"):
            lat = latency_run(
                ep, server.proc.pid if server.proc else None, consumer, RATE, sizes, report
            )
            results[consumer] = lat
            say(f"  SQLite: {lat.text}")
            report.detail("latency, tidings on SQLite", lat.text)
            for q, value in (("p50", lat.p50), ("p99", lat.p99)):
                report.figures[f"latency_{consumer}_{q}_ms_tidings_sqlite"] = round(value, 2)
        worse = max(results.values(), key=lambda lat: lat.p99)
        report.figures["latency_p50_ms_tidings_sqlite"] = round(worse.p50, 2)
        report.figures["latency_p99_ms_tidings_sqlite"] = round(worse.p99, 2)
