"""The redis_stream target, and the relay to it, beside redis-py's own XADD, with the same
confirmation.

``python -m bench.redis_stream [--quick] [--results DIR]``: a SQLite backlog of deposits (the relay
benchmark's workload, :mod:`bench.relay.workload`) is relayed by Spark to a
``redis_stream`` target on the shared server (127.0.0.1:6379), and the same number of
same-size entries is added by redis-py alone: pipelined ``XADD``s whose replies (the entry
ids, the confirmation the target waits for too) are read per window. The raw figure is run
before and after the relay, so a change in the machine's speed meanwhile shows; the goal is
0.8 x raw or more (issue 31) for the target itself: the backlog's events given to
:meth:`RedisStreamTarget.publish` in calls of ``CALL`` events, as a relay task hands them
over (what the target adds: its rounds per key, entries, the replies settled per event),
beside raw on the same entries. The relay's figure (Spark reading the log and recording
each event's outcome, around the same target) is shown beside them: it is bounded by the
relay's own rate, whatever the target (see the relay benchmark). The relay's figure counts
only if every event is PUBLISHED and in the stream. The report, with the machine, goes to
``bench/results/redis_stream.json`` and ``.md`` (``--results``: another folder); record it
from a quiet machine only (``--quick`` is a check that the script works, its figures mean
nothing: give it ``--results`` elsewhere).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import select

from bench.harness.machine import code_version, machine_info
from bench.harness.markdown import command, heading, table
from bench.harness.outbox import status_counts
from bench.harness.progress import runtime_s, say
from bench.harness.report import write_report
from bench.harness.sizes import arguments, mode
from bench.relay.drains import relay_drain
from bench.relay.workload import EVENT_TYPE, bench_config, fill_backlog
from tidings.config import TidingsConfig
from tidings.db import make_engine
from tidings.events.outbox import OutboxEvent
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import OUTBOX_EVENT_COLUMNS, outbox_event, outbox_event_from_row
from tidings.targets.kinds.redis_stream.config import RedisStreamTargetConfig
from tidings.targets.kinds.redis_stream.entries import entry_fields
from tidings.targets.kinds.redis_stream.target import RedisStreamTarget

REDIS_URL = "redis://127.0.0.1:6379/0"
#: Events per run, partition keys, and the raw client's pipeline window.
SIZES = {"full": (200_000, 1000, 5000), "quick": (2_000, 50, 500)}
GOAL_RATIO = 0.8
#: Events per call of the target's publish, as a relay task hands over a micro-batch's part.
CALL = 1000


def sample_fields(cfg: TidingsConfig) -> dict[bytes, bytes]:
    """The fields of one real relay entry, for same-size raw entries."""
    engine = make_engine(cfg.database.url)
    columns = [outbox_event.c[name] for name in OUTBOX_EVENT_COLUMNS]
    with engine.connect() as conn:
        row = conn.execute(select(*columns).order_by(outbox_event.c.seq).limit(1)).one()
    engine.dispose()
    return entry_fields(outbox_event_from_row(*row))


def backlog_events(cfg: TidingsConfig) -> list[OutboxEvent]:
    """The backlog's events in log order, as the relay reads them."""
    engine = make_engine(cfg.database.url)
    columns = [outbox_event.c[name] for name in OUTBOX_EVENT_COLUMNS]
    with engine.connect() as conn:
        rows = conn.execute(select(*columns).order_by(outbox_event.c.seq)).all()
    engine.dispose()
    return [outbox_event_from_row(*row) for row in rows]


def target_run(events: list[OutboxEvent]) -> float:
    """The events through :class:`RedisStreamTarget` in calls of :data:`CALL`, to a fresh
    stream, every event confirmed (its entry id read); msg/s."""
    stream = f"bench:target:{uuid.uuid4().hex[:8]}"
    config = RedisStreamTargetConfig(kind="redis_stream", url=REDIS_URL, stream=stream)
    target = RedisStreamTarget("bench", config)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        if target.publish(events[:1]) != [None]:  # connected before the clock starts
            raise RuntimeError("the target refused the first event")
        started = time.perf_counter()
        for at in range(1, len(events), CALL):
            results = target.publish(events[at : at + CALL])
            if any(results):
                raise RuntimeError(f"the target refused events: {results[:3]}")
        elapsed = time.perf_counter() - started
        if (stored := client.xlen(stream)) != len(events):
            raise RuntimeError(f"target: the stream holds {stored}, expected {len(events)}")
        return (len(events) - 1) / elapsed
    finally:
        target.close()
        client.delete(stream)
        client.close()


def raw_xadd(fields: dict[bytes, bytes], events: int, window: int) -> float:
    """redis-py alone: ``events`` XADDs to a fresh stream, a fresh ``event_id`` each,
    pipelined in ``window``s whose replies are all read; msg/s."""
    client = redis.Redis.from_url(REDIS_URL)
    stream = f"bench:raw:{uuid.uuid4().hex[:8]}"
    try:
        started = time.perf_counter()
        for start in range(0, events, window):
            pipe = client.pipeline(transaction=False)
            for _ in range(min(window, events - start)):
                pipe.xadd(stream, {**fields, b"event_id": uuid.uuid4().hex.encode()})
            replies = pipe.execute()
            if not all(isinstance(reply, bytes) for reply in replies):
                raise RuntimeError(f"raw XADD: unexpected replies {replies[:3]}")
        elapsed = time.perf_counter() - started
        if (stored := client.xlen(stream)) != events:
            raise RuntimeError(f"raw XADD: the stream holds {stored}, expected {events}")
        return events / elapsed
    finally:
        client.delete(stream)
        client.close()


def relay_run(spark: Any, cfg: TidingsConfig, stream: str, events: int) -> float | None:
    """The backlog relayed by Spark to ``stream``; events/s, or None if not all arrived."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        secs, _batches, _monitor = relay_drain(spark, cfg)
        counts = status_counts(make_engine(cfg.database.url))
        stored = client.xlen(stream)
    finally:
        client.delete(stream)
        client.close()
    say(f"  relay: {events:,} events in {secs:.1f} s; statuses {counts}, stream held {stored:,}")
    return events / secs if counts.get("PUBLISHED") == events and stored == events else None


def markdown(result: dict[str, Any], quick: bool) -> str:
    """redis_stream.md: the relay beside raw XADD, the goal, whether every event arrived."""
    relay = result["relay_redis_ev_s"]
    ratio = result["ratio"]
    rows = [
        ("the redis_stream target's publish", f"{result['target_redis_ev_s']:,.0f}", ""),
        ("raw redis-py XADD, before and after (mean)", f"{result['raw_redis_xadd_ev_s']:,.0f}",
         ""),
        ("target ÷ raw", f"{result['target_ratio']:.2f}", f"≥ {GOAL_RATIO}"),
        ("relay to the redis_stream target (Spark, the log read and recorded)",
         "n/a" if relay is None else f"{relay:,.0f}", ""),
        ("relay ÷ raw", "n/a" if ratio is None else f"{ratio:.2f}", ""),
    ]  # fmt: skip
    s = result["sizes"]
    lines = [
        *heading(
            "Redis Streams target benchmark" + (" (--quick)" if quick else ""),
            command("redis_stream", *(["--quick"] if quick else [])),
            result["machine"],
            result["runtime_s"],
            code=result["code"],
        ),
        f"{s['events']:,} events over {s['keys']:,} keys, a SQLite backlog relayed by Spark to "
        f"one stream on the shared Redis; raw: pipelined XADDs of same-size entries "
        f"({result['entry_bytes']} B in {result['entry_fields']} fields), replies read per "
        f"window of {s['window']:,}; the target's publish in calls of {CALL:,} events; "
        "raw runs before the target, between the target and the relay, and after the relay: "
        + ", ".join(f"{r:,.0f}" for r in result["raw_runs_ev_s"])
        + " msg/s.",
        "",
        *table(("events/s", "value", "goal"), "lrl", rows),
        "",
    ]
    if relay is None:
        lines += ["The relay's figure is not counted: not every event was PUBLISHED and in the "
                  "stream.", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    options = arguments("bench.redis_stream", __doc__, "2,000 events, to check it runs")
    args = options.parse_args()
    events, keys, window = SIZES[mode(args.quick)]
    from tidings.pipeline.spark import spark_session

    results = args.results.resolve()
    machine = machine_info()  # before the work folder becomes the current one (and goes)
    with tempfile.TemporaryDirectory(prefix="tidings-bench-redis-") as tmp:
        work = Path(tmp)
        os.chdir(work)  # whatever Spark writes stays out of the checkout
        stream = f"bench:relay:{uuid.uuid4().hex[:8]}"
        target = {"kind": "redis_stream", "url": REDIS_URL, "stream": stream}
        cfg = bench_config(work, "redis", {"redis": target}, {EVENT_TYPE: ["redis"]})
        warm = bench_config(work, "warm", {"redis": {**target, "stream": f"{stream}:warm"}},
                            {EVENT_TYPE: ["redis"]})  # fmt: skip
        fill_backlog(Outbox(make_engine(warm.database.url), warm.outbox), 10, 5)
        say(f"redis_stream benchmark ({mode(args.quick)}): {events:,} events over {keys:,} keys")
        fill_backlog(Outbox(make_engine(cfg.database.url), cfg.outbox), events, keys)
        fields = sample_fields(cfg)
        entry_bytes = sum(len(k) + len(v) for k, v in fields.items())
        say(f"  entry: {entry_bytes} B in {len(fields)} fields")
        spark = spark_session(cfg.relay, app_name="tidings-bench-redis")
        try:
            relay_drain(spark, warm)  # Spark's and the workers' first start are not timed
            redis.Redis.from_url(REDIS_URL).delete(f"{stream}:warm")
            raw = [raw_xadd(fields, events, window)]
            direct = target_run(backlog_events(cfg))
            say(f"  target: {direct:,.0f} msg/s")
            raw.append(raw_xadd(fields, events, window))
            rate = relay_run(spark, cfg, stream, events)
            raw.append(raw_xadd(fields, events, window))
        finally:
            spark.stop()
    baseline = statistics.mean(raw)
    say(f"target_redis_ev_s = {direct:,.0f}; ratio {direct / baseline:.2f} (goal >= {GOAL_RATIO})")
    say(f"raw redis-py XADD (before, between, after): {', '.join(f'{r:,.0f}' for r in raw)} msg/s")
    if rate is None:
        say("relay_redis_ev_s: not counted (not every event was PUBLISHED and in the stream)")
    else:
        say(f"relay_redis_ev_s = {rate:,.0f}; raw_redis_xadd_ev_s = {baseline:,.0f}; "
            f"ratio {rate / baseline:.2f} (the relay's own rate bounds it)")  # fmt: skip
    result = {
        "machine": machine,
        "code": code_version(),
        "runtime_s": runtime_s(),
        "sizes": {"events": events, "keys": keys, "window": window},
        "entry_bytes": entry_bytes,
        "entry_fields": len(fields),
        "target_redis_ev_s": round(direct, 1),
        "target_ratio": round(direct / baseline, 3),
        "relay_redis_ev_s": None if rate is None else round(rate, 1),
        "raw_redis_xadd_ev_s": round(baseline, 1),
        "raw_runs_ev_s": [round(r, 1) for r in raw],
        "ratio": None if rate is None else round(rate / baseline, 3),
        "goal_ratio": GOAL_RATIO,
    }
    paths = write_report("redis_stream", result, markdown(result, args.quick), results)
    say(f"wrote {paths[0]} and {paths[1]}")
    return 0 if rate is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
