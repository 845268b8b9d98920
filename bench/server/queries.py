"""The query steps: latest-by-type queries matching 100, 300 and 3,000 types and a
time-ordered query of the newest 100 events, each answer checked."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import hat.event.common as hc
from hat.event import eventer

from bench.harness.figures import percentile
from bench.harness.progress import say
from bench.server.servers import Run
from bench.server.workload import (
    LATEST,
    ORDERED_PATTERN,
    ORDERED_RESULTS,
    ServerSizes,
    check,
    check_registered,
    query_types,
    reg_event,
    ts_key,
)


async def query_setup(client: eventer.Client, run: Run, sizes: ServerSizes) -> None:
    types = query_types()
    started = time.perf_counter()
    for rnd in range(sizes.query_rounds):
        for s in range(0, len(types), sizes.batch):
            batch = [
                reg_event(t, {"round": rnd, "i": s + j})
                for j, t in enumerate(types[s : s + sizes.batch])
            ]
            results = await client.register_with_response(batch)
            check_registered(results, batch)
    run.last_event = results[-1]
    total = len(types) * sizes.query_rounds
    say(
        f"[{run.kind}]   query setup: {total:,} events over {len(types):,} types in "
        f"{time.perf_counter() - started:.1f} s"
    )


async def timed_queries(
    client: eventer.Client,
    query: hc.QueryData,
    verify: Callable[[list[hc.Event]], None],
    count: int,
    warmup: int,
    *,
    min_count: int | None = None,
    budget_s: float | None = None,
) -> tuple[list[float], float]:
    """Milliseconds per query, and the client's median CPU milliseconds per query (sending,
    receiving, decoding: a floor under the latency that no server can remove); every
    answer verified. Stops early (at ``min_count`` or more) when ``budget_s`` is spent."""
    for _ in range(warmup):
        verify(await client.query(query))
    times: list[float] = []
    client_cpu: list[float] = []
    # The benchmark process holds many objects of its own (the events it registered, their
    # answers): out of the collector's sight during the series, so that a full collection
    # of them does not land on some query's time, whichever server answers it.
    gc.collect()
    gc.freeze()
    try:
        series = time.perf_counter()
        for _ in range(count):
            started, started_cpu = time.perf_counter(), time.process_time()
            events = await client.query(query)
            times.append((time.perf_counter() - started) * 1000)
            client_cpu.append((time.process_time() - started_cpu) * 1000)
            verify(events)
            if (
                budget_s is not None
                and min_count is not None
                and len(times) >= min_count
                and time.perf_counter() - series > budget_s
            ):
                break
    finally:
        gc.unfreeze()
    return times, percentile(client_cpu, 50)


def verify_latest(pattern: tuple[str, ...], expected: int, rounds: int) -> Callable[..., None]:
    types = {t for t in query_types() if hc.matches_query_type(t, pattern)}
    check(len(types) == expected, f"{pattern} matches {len(types)} types, not {expected}")

    def verify(events: list[hc.Event]) -> None:
        check(
            len(events) == expected,
            f"latest {pattern}: {len(events)} events, expected {expected} (one per type)",
        )
        got = {tuple(e.event_type) for e in events}
        check(got == types, f"latest {pattern}: wrong or repeated types ({len(got)} distinct)")
        stale = [e for e in events if e.payload is None or e.payload.data["round"] != rounds - 1]
        check(not stale, f"latest {pattern}: {len(stale)} events are not the newest of their type")
        keys = [ts_key(e) for e in events]
        check(keys == sorted(keys, reverse=True), f"latest {pattern}: not newest first")

    return verify


async def latest_queries(client: eventer.Client, run: Run, sizes: ServerSizes) -> None:
    for name, (pattern, expected) in LATEST.items():
        query = hc.QueryData(
            event_types=[pattern],
            unique_type=True,
            max_results=expected,
            order=hc.Order.DESCENDING,
            order_by=hc.OrderBy.TIMESTAMP,
        )
        verify = verify_latest(pattern, expected, sizes.query_rounds)
        if expected >= 3000:
            times, client_ms = await timed_queries(
                client,
                query,
                verify,
                sizes.queries_3000,
                min(sizes.warmup, 2),
                min_count=sizes.min_queries_3000,
                budget_s=sizes.query_budget_s,
            )
        else:
            times, client_ms = await timed_queries(
                client, query, verify, sizes.queries, sizes.warmup
            )
        say(f"[{run.kind}]   {name}: {len(times)} queries")
        run.record(f"{name}_p50_ms", percentile(times, 50))
        run.record(f"{name}_p99_ms", percentile(times, 99))
        run.record(f"{name}_client_cpu_ms", client_ms)


async def ordered_queries(client: eventer.Client, run: Run, sizes: ServerSizes) -> None:
    newest = run.last_event
    assert newest is not None
    query = hc.QueryData(
        event_types=[ORDERED_PATTERN],
        order_by=hc.OrderBy.TIMESTAMP,
        order=hc.Order.DESCENDING,
        max_results=ORDERED_RESULTS,
    )

    def verify(events: list[hc.Event]) -> None:
        check(len(events) == ORDERED_RESULTS, f"ordered: {len(events)} events, not 100")
        check(all(e.event_type[0] == "bench" for e in events), "ordered: a non-bench type")
        keys = [ts_key(e) for e in events]
        check(keys == sorted(keys, reverse=True), "ordered: not newest first")
        check(keys[0] == ts_key(newest), "ordered: the first event is not the newest one")
        ids = {e.event_id for e in events}
        check(len(ids) == len(events), "ordered: repeated events")

    times, client_ms = await timed_queries(client, query, verify, sizes.queries, sizes.warmup)
    run.record("ordered_p50_ms", percentile(times, 50))
    run.record("ordered_p99_ms", percentile(times, 99))
    run.record("ordered_client_cpu_ms", client_ms)
