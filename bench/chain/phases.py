"""The chain benchmark's three measurements on one outbox database: the relay's own rate
into the embedded store (the reference), the chain's sustained rate to a reliable consumer,
and latencies at a steady offered rate, hop by hop."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names
from bench.chain.rig import ChainEnd, chain_target
from bench.harness.figures import percentile
from bench.harness.outbox import publish_latencies_ms, status_counts
from bench.harness.progress import say
from bench.harness.sizes import Scale, Sizes
from bench.relay.drains import relay_drain
from bench.relay.workload import EVENT_TYPE, fill_backlog, store_count, store_target
from tidings.config import TidingsConfig, load_config
from tidings.db import make_engine
from tidings.outbox.producer import Outbox


@dataclass(frozen=True)
class ChainSizes(Sizes):
    """Backlog events, partition keys, the latency run's offered rate, warm-up and length."""

    backlog: int
    keys: int
    rate: int
    warmup_s: float
    seconds: float


SCALE = Scale(
    full=ChainSizes(100_000, 1000, 1000, 10.0, 30.0),
    quick=ChainSizes(10_000, 1000, 1000, 3.0, 8.0),
)
GOALS: dict[str, dict[str, Any]] = {
    "sqlite.latency_consumer_p50_ms": {"max": 250},
    "sqlite.latency_consumer_p99_ms": {"max": 600},
    "sqlite.sustained_ratio": {"min": 0.7},
}


def chain_config(
    work: Path, name: str, database_url: str | None, target: dict[str, Any], **relay: Any
) -> TidingsConfig:
    """A relay with one target, its outbox on ``database_url`` (a SQLite file if None)."""
    directory = work / name
    directory.mkdir(parents=True, exist_ok=True)
    return load_config(
        {
            "database": {"url": database_url or f"sqlite:///{directory / 'app.db'}"},
            "outbox": {"originator": "bench"},
            "targets": {"t": target},
            "routing": {"routes": {EVENT_TYPE: ["t"]}},
            "relay": {
                "checkpoint_dir": str(directory / "checkpoint"),
                "max_events_per_batch": 100_000,
                "partitions": 2,
                **relay,
            },
        }
    )


def warm_up(spark: Any, work: Path) -> None:
    """Small drains into the store and into a chain first, so that no measurement times
    Spark's and its Python workers' first start (class loading, imports, connections)."""
    small = ChainSizes(2000, 100, 0, 0.0, 0.0)
    reference_rate(spark, work, "warm-ref", None, small)
    sustained_rate(spark, work, "warm-chain", None, small)


def reference_rate(spark: Any, work: Path, name: str, url: str | None, sizes: ChainSizes) -> float:
    """Events/s of a relay draining a backlog into the embedded event store."""
    cfg = chain_config(work, name, url, store_target(work / name))
    engine = make_engine(cfg.database.url)
    fill_backlog(Outbox(engine, cfg.outbox), sizes.backlog, sizes.keys)
    secs, _, _ = relay_drain(spark, cfg)
    stored = store_count(cfg.targets["t"].url)  # type: ignore[union-attr]
    published = status_counts(engine).get("PUBLISHED", 0)
    engine.dispose()
    say(f"  reference: {sizes.backlog:,} in {secs:.1f} s; stored {stored:,}")
    if stored != sizes.backlog or published != sizes.backlog:
        raise RuntimeError(f"reference drain incomplete: stored {stored}, published {published}")
    return sizes.backlog / secs


def sustained_rate(
    spark: Any, work: Path, name: str, url: str | None, sizes: ChainSizes
) -> tuple[float, float]:
    """Events/s from the relay's start until the reliable consumer holds the whole backlog,
    and until the relay had every event confirmed by the server (the relay's hop alone)."""
    end = ChainEnd(work / f"{name}-end")
    end.start()
    try:
        cfg = chain_config(work, name, url, chain_target(end.eventer))
        engine = make_engine(cfg.database.url)
        fill_backlog(Outbox(engine, cfg.outbox), sizes.backlog, sizes.keys)
        started = time.time()
        relayed_s, _, _ = relay_drain(spark, cfg)
        done = end.wait_consumed(sizes.backlog, 300)
        engine.dispose()
    finally:
        end.close()
    if done is None:
        raise RuntimeError(f"the consumer got {len(end.arrivals.consumed)} of {sizes.backlog}")
    secs = done - started
    say(
        f"  sustained: {sizes.backlog:,} consumed {secs:.1f} s after the relay started, "
        f"all confirmed by the server after {relayed_s:.1f} s"
    )
    return sizes.backlog / secs, sizes.backlog / relayed_s


def latencies(
    spark: Any, work: Path, name: str, url: str | None, sizes: ChainSizes
) -> dict[str, float]:
    """Per-hop and end-to-end latency percentiles (ms) at ``sizes.rate`` offered."""
    from tidings.pipeline.relay_query import start_relay

    end = ChainEnd(work / f"{name}-end")
    end.start()
    try:
        cfg = chain_config(work, name, url, chain_target(end.eventer), trigger_interval="20ms")
        engine = make_engine(cfg.database.url)
        outbox = Outbox(engine, cfg.outbox)
        query = start_relay(spark, cfg)
        total = int(sizes.rate * (sizes.warmup_s + sizes.seconds))
        measured_from = _produce(outbox, sizes.rate, total, sizes.warmup_s)
        end.wait_consumed(total, 120)
        time.sleep(1.0)  # the subscriber's last frames
        query.stop()
        confirm = publish_latencies_ms(engine, measured_from)
        engine.dispose()
    finally:
        end.close()
    a = end.arrivals
    ids = [i for i, t in a.logged.items() if t >= measured_from]
    hops = {
        "consumer": [a.consumed[i] - a.logged[i] for i in ids if i in a.consumed],
        "subscriber": [a.subscribed[i] - a.logged[i] for i in ids if i in a.subscribed],
        "stored": [a.stored[i] - a.logged[i] for i in ids if i in a.stored],
        "stored_to_consumer": [
            a.consumed[i] - a.stored[i] for i in ids if i in a.stored and i in a.consumed
        ],
        "stored_to_subscriber": [
            a.subscribed[i] - a.stored[i] for i in ids if i in a.stored and i in a.subscribed
        ],
    }
    out: dict[str, float] = {"latency_events": len(ids)}
    for hop, values in [*hops.items(), ("confirmed", [v / 1000 for v in confirm])]:
        if values:
            out[f"latency_{hop}_p50_ms"] = round(percentile(values, 50) * 1000, 1)
            out[f"latency_{hop}_p99_ms"] = round(percentile(values, 99) * 1000, 1)
    say(f"  latency: {out}")
    return out


def _produce(outbox: Outbox, rate: int, total: int, warmup_s: float) -> float:
    """One event per transaction at ``rate``/s, ``total`` in all, in a thread; returns when
    the warm-up ended (epoch seconds) once it is done."""
    started = time.time()
    t0 = time.monotonic()

    def run() -> None:
        for i in range(total):
            account = f"ACC{i % 1000:05d}"
            with outbox.transaction() as tx:
                tx.emit(EVENT_TYPE, {"account": account, "op": i}, partition_key=account)
            delay = t0 + (i + 1) / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    producer = threading.Thread(target=run)
    producer.start()
    producer.join()
    return started + warmup_s
