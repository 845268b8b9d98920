"""The register steps: batches, single events one at a time, and fire-and-forget registers
until every event is stored."""

from __future__ import annotations

import asyncio
import time

import hat.event.common as hc
from hat.event import eventer

from bench.harness.progress import say
from bench.server.servers import Run
from bench.server.workload import ServerSizes, check, check_registered, is_floor, reg_event


async def register_batch(client: eventer.Client, run: Run, sizes: ServerSizes) -> None:
    n, b = sizes.register_events, sizes.batch
    batches = [
        [reg_event(("bench", "r", "batch", f"k{i % 100}"), {"seq": i}) for i in range(s, s + b)]
        for s in range(0, n, b)
    ]
    # The first step of each server: a few untimed batches warm the client and the server
    # (the first server run also warms the benchmark process itself).
    for w in range(sizes.warmup):
        warm = [reg_event(("bench", "r", "warm", f"k{i}"), {"seq": w}) for i in range(b)]
        check_registered(await client.register_with_response(warm), warm)
    started = time.perf_counter()
    for batch in batches:
        results = await client.register_with_response(batch)
        check_registered(results, batch)
    run.record("register_batch_ev_s", n / (time.perf_counter() - started))
    run.last_event = results[-1]


async def register_single(client: eventer.Client, run: Run, sizes: ServerSizes) -> None:
    n = sizes.register_events
    events = [reg_event(("bench", "r", "single", f"k{i % 100}"), {"seq": i}) for i in range(n)]
    started = time.perf_counter()
    for event in events:
        results = await client.register_with_response([event])
        check_registered(results, [event])
    run.record("register_single_ev_s", n / (time.perf_counter() - started))
    run.last_event = results[-1]


async def count_events(client: eventer.Client, pattern: tuple[str, ...]) -> int:
    events = await client.query(hc.QueryData(event_types=[pattern], unique_type=False))
    return len(events)


async def register_ff(client: eventer.Client, run: Run, sizes: ServerSizes) -> None:
    """Fire-and-forget registers, then one register_with_response on the same connection.

    Both servers handle one connection's requests in order, so the marker's reply means the
    events before it were registered; a count query afterwards (untimed if it agrees) checks
    that. If it does not agree yet, the clock runs on until a count query sees them all.
    """
    n = sizes.register_events
    pattern = ("bench", "r", "ff", "*")
    events = [reg_event(("bench", "r", "ff", f"k{i % 100}"), {"seq": i}) for i in range(n)]
    marker = reg_event(("bench", "r", "ff-marker"), {"seq": n})
    started = time.perf_counter()
    for event in events:
        client.register([event])
    try:
        results = await client.register_with_response([marker])
    except ConnectionError:
        raise ConnectionError(
            f"the connection closed {time.perf_counter() - started:.1f} s after the first of "
            f"{n:,} fire-and-forget registers, before the marker's reply"
        ) from None
    elapsed = time.perf_counter() - started
    check_registered(results, [marker])
    if is_floor(run.kind):  # answers no count query; it answers in request order
        run.record("register_ff_ev_s", n / elapsed)
        return
    count = await count_events(client, pattern)
    while count < n:
        say(f"[{run.kind}]   after the marker only {count:,} of {n:,} ff events are queryable")
        check(time.perf_counter() - started < 60, f"only {count} of {n} ff events stored")
        await asyncio.sleep(0.01)
        count = await count_events(client, pattern)
        elapsed = time.perf_counter() - started
    check(count == n, f"{count} ff events stored, {n} sent")
    run.record("register_ff_ev_s", n / elapsed)
    run.last_event = results[-1]
