"""Recovery of the streaming relay after a JetStream outage under steady traffic.

Run ``.venv/bin/python -m bench.outage [--quick]`` from the checkout. A private
``nats-server`` (JetStream, its own storage) is the only target; a paced producer emits one
event per transaction over 20 partition keys; the streaming relay runs with
``relay.replay_every: null`` (no scheduled replay: the relay alone must resume held keys).
After a warm-up the server is killed for a while and started again on the same storage.
Measured:

* ``recovery_s``: from the restart until every event logged before it is PUBLISHED;
* latency (``last_publish_at - logged_at``) p50/p99 before the outage and in the last part
  of the traffic after it (is latency back to its pre-outage level?);
* during the outage: the most events waiting (HELD), FAILED events and retries charged;
* that every event reached the stream exactly once and in per-key order.

Writes ``bench/results/outage.json`` and ``bench/results/outage.md``, with the machine and
the CPU other processes used meanwhile (a loaded machine delays recovery).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from sqlalchemy import select

from bench.harness.figures import percentile
from bench.harness.machine import machine_info
from bench.harness.markdown import command, heading, table
from bench.harness.outbox import max_seq, publish_latencies_ms, status_counts
from bench.harness.processes import NatsServer, free_port
from bench.harness.producer import PacedProducer
from bench.harness.progress import runtime_s, say
from bench.harness.report import write_report
from bench.harness.sizes import Scale, Sizes, arguments
from bench.harness.trees import TreeMonitor
from tidings.config import TidingsConfig, load_config
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.relay import run_relay
from tidings.pipeline.spark import spark_session

KEYS = 20
STREAM = "OUTAGE_BENCH"


@dataclass(frozen=True)
class OutageSizes(Sizes):
    """The outage benchmark's traffic and its phases."""

    rate: int  # events per second offered
    warm_s: float  # traffic before the outage
    outage_s: float  # how long the target is down
    after_s: float  # traffic after the restart


SCALE = Scale(full=OutageSizes(150, 20.0, 20.0, 60.0), quick=OutageSizes(100, 10.0, 10.0, 25.0))


def open_rows(engine: Any, upto: int | None = None) -> dict[str, int]:
    """Outbox events not yet PUBLISHED, per status (up to sequence ``upto``, if given)."""
    return {s: n for s, n in status_counts(engine, upto).items() if s != "PUBLISHED"}


async def _stream_ids(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        count = (await js.stream_info(STREAM)).state.messages
        return [(await js.get_msg(STREAM, s)).headers["Nats-Msg-Id"] for s in range(1, count + 1)]
    finally:
        await nc.close()


def outage_config(work: Path, url: str) -> TidingsConfig:
    """The private server as the only target, with no scheduled replay: after the outage the
    relay alone must resume the keys it held."""
    return load_config(
        {
            "database": {"url": f"sqlite:///{work / 'app.db'}"},
            "targets": {
                "js": {
                    "kind": "jetstream",
                    "servers": [url],
                    "stream": STREAM,
                    "subject_prefix": "outage",
                    "ack_timeout": "1s",
                }
            },
            "routing": {"routes": {"Moved": ["js"]}},
            "relay": {"checkpoint_dir": str(work / "checkpoint"), "replay_every": None},
        }
    )


@dataclass
class Timeline:
    """When the traffic started, the target was killed and came back, and the traffic ended
    (epoch seconds), with what the outbox held meanwhile."""

    start: float
    kill: float = 0.0
    back: float = 0.0
    end: float = 0.0
    back_seq: int = 0  # the newest event logged before the restart
    max_held: int = 0  # the most events HELD during the outage
    during: dict[str, int] = field(default_factory=dict)  # open events at its end
    recovery: float | None = None  # restart -> everything logged before it PUBLISHED


def _outage(engine: Any, server: NatsServer, outage_s: float, t: Timeline) -> None:
    """Kill the target for ``outage_s``, watching how many events the relay holds, and
    start it again on its storage."""
    server.kill()
    t.kill = time.time()
    say("target killed")
    while time.time() < t.kill + outage_s:
        t.max_held = max(t.max_held, open_rows(engine).get("HELD", 0))
        time.sleep(0.5)
    t.during = open_rows(engine)
    server.start()
    t.back, t.back_seq = time.time(), max_seq(engine)
    say(f"target back; open then: {t.during}")


def _note_recovery(engine: Any, t: Timeline) -> None:
    """Record the recovery time once everything logged before the restart is PUBLISHED."""
    if t.recovery is None and not open_rows(engine, t.back_seq):
        t.recovery = time.time() - t.back
        say(f"everything logged before the restart delivered after {t.recovery:.1f} s")


def traffic(
    engine: Any, producer: PacedProducer, server: NatsServer, phases: tuple[float, float, float]
) -> Timeline:
    """A published warm-up event (Spark's start-up before the clock starts), then the paced
    traffic: ``phases`` = (warm-up, outage, after the restart) in seconds; then waits up to
    300 s until every event is PUBLISHED."""
    warm_s, outage_s, after_s = phases
    with producer.outbox.transaction() as tx:
        tx.emit("Moved", {"warm": True}, partition_key="warm")
    while open_rows(engine):
        time.sleep(0.1)
    producer.start()
    t = Timeline(start=time.time())
    time.sleep(warm_s)
    _outage(engine, server, outage_s, t)
    while time.time() < t.back + after_s:
        _note_recovery(engine, t)
        time.sleep(0.2)
    producer.stop.set()
    producer.join()
    t.end = time.time()
    deadline = time.time() + 300
    while open_rows(engine) and time.time() < deadline:
        _note_recovery(engine, t)
        time.sleep(0.2)
    return t


def delivery(engine: Any, url: str, keys: dict[str, str]) -> dict[str, Any]:
    """What the stream received against what the outbox logged: every event once, each key's
    events in the order they were logged, and the retries the outage cost."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                outbox_event.c.event_id, outbox_event.c.retry_count, outbox_event.c.status
            ).order_by(outbox_event.c.seq)
        ).all()
    delivered = asyncio.run(_stream_ids(url))
    order = [r.event_id for r in rows]
    in_order = all(
        [e for e in delivered if keys.get(e) == k] == [e for e in order if keys.get(e) == k]
        for k in {f"k{i}" for i in range(KEYS)}
    )
    return {
        "events": len(rows),
        "retries_charged": sum(r.retry_count for r in rows),
        "all_published": {r.status for r in rows} == {"PUBLISHED"},
        "exactly_once": sorted(delivered) == sorted(order),
        "per_key_order": in_order,
    }


def figures(t: Timeline, engine: Any, after_s: float, checks: dict[str, Any]) -> dict[str, Any]:
    """outage.json's figures, in report order."""
    # Not those the kill caught in flight.
    before = publish_latencies_ms(engine, t.start + 5, t.kill - 2)
    tail = publish_latencies_ms(engine, t.end - min(30.0, after_s / 2), t.end)
    return {
        "events": checks["events"],
        "recovery_s": None if t.recovery is None else round(t.recovery, 1),
        "latency_before_p50_ms": round(percentile(before, 50)),
        "latency_before_p99_ms": round(percentile(before, 99)),
        "latency_after_p50_ms": round(percentile(tail, 50)),
        "latency_after_p99_ms": round(percentile(tail, 99)),
        "max_held_during_outage": t.max_held,
        "failed_during_outage": t.during.get("FAILED", 0),
        **{k: v for k, v in checks.items() if k != "events"},
    }


def main() -> int:
    args = arguments("bench.outage", __doc__, "shorter phases (about 1 minute)").parse_args()
    sizes = SCALE.pick(args.quick)
    rate, warm_s, outage_s, after_s = sizes.rate, sizes.warm_s, sizes.outage_s, sizes.after_s
    work = Path(tempfile.mkdtemp(prefix="tidings-outage-"))
    server = NatsServer(free_port(), work / "jetstream")
    config = outage_config(work, server.url)
    engine = make_engine(config.database.url)
    producer = PacedProducer(Outbox(engine), rate, KEYS, "Moved")
    machine = machine_info()
    say(
        f"outage benchmark: {rate} ev/s, warm {warm_s:g} s, outage {outage_s:g} s, then "
        f"{after_s:g} s; machine {machine}"
    )
    server.start()
    spark = spark_session(config.relay, app_name="tidings-outage-bench")
    stop = threading.Event()
    relay = threading.Thread(target=run_relay, args=(spark, config), kwargs={"stop": stop})
    monitor = TreeMonitor(os.getpid()).start(1.0)
    result: dict[str, Any] = {"machine": machine, "rate_ev_s": rate, "outage_s": outage_s}
    try:
        relay.start()
        timeline = traffic(engine, producer, server, (warm_s, outage_s, after_s))
    finally:
        producer.stop.set()
        stop.set()
        relay.join(60)
        monitor.stop()
        spark.stop()
    checks = delivery(engine, server.url, producer.keys)
    server.kill()
    result.update(figures(timeline, engine, after_s, checks))
    result["other_processes_cpu_share"] = round(monitor.foreign_share(), 3)
    say(json.dumps(result, indent=2))
    write_report("outage", result, markdown(result, args.quick, runtime_s()), args.results)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if result["exactly_once"] and result["per_key_order"] else 1


def markdown(r: dict[str, Any], quick: bool, runtime: float) -> str:
    rows = [
        ("recovery: restart → everything logged before it PUBLISHED", f"{r['recovery_s']} s"),
        (
            "latency before the outage p50 / p99",
            f"{r['latency_before_p50_ms']} / {r['latency_before_p99_ms']} ms",
        ),
        (
            "latency at the end of the traffic after it p50 / p99",
            f"{r['latency_after_p50_ms']} / {r['latency_after_p99_ms']} ms",
        ),
        ("most events HELD during the outage", f"{r['max_held_during_outage']:,}"),
        ("FAILED at the end of the outage", f"{r['failed_during_outage']}"),
        ("retries charged in all", f"{r['retries_charged']}"),
        (
            "every event once / per-key order / all PUBLISHED",
            f"{r['exactly_once']} / {r['per_key_order']} / {r['all_published']}",
        ),
    ]
    more = f" Other processes used {r['other_processes_cpu_share']:.0%} of the cores meanwhile."
    lines = [
        *heading(
            "Relay recovery after a JetStream outage",
            command("outage", *(["--quick"] if quick else [])),
            r["machine"],
            runtime,
            more=more,
        ),
        f"{r['rate_ev_s']} ev/s over {KEYS} keys, target killed for {r['outage_s']:g} s, "
        f"`replay_every: null`; {r['events']:,} events in all.",
        "",
        *table(("measure", "value"), "lr", rows),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
