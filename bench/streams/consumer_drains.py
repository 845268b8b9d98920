"""Part (b)'s drains: tidings' Python consumer (``consume()``, push) against a NATS JetStream
durable pull consumer, both draining the same number of events, runs interleaved."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig

from bench.harness.progress import say
from bench.harness.report import Report
from bench.streams.usage import measure_cpu, record_cpu
from bench.streams.workload import JS_STREAM, JS_SUBJECT, PASSWORD, USER, StreamsSizes, event_data
from tidings.streams.client import StreamEvent, consume


async def until_done(done: asyncio.Event, task: asyncio.Task[Any], timeout: float) -> None:
    """Wait for ``done``; the consumer task's error if it ends first, TimeoutError after
    ``timeout``."""
    waiter = asyncio.ensure_future(done.wait())
    try:
        finished, _ = await asyncio.wait(
            {waiter, task}, timeout=timeout, return_when="FIRST_COMPLETED"
        )
    finally:
        waiter.cancel()
    if task in finished:
        task.result()
        raise RuntimeError("the consumer stopped")
    if waiter not in finished:
        raise TimeoutError(f"not done after {timeout:g} s")


@contextlib.asynccontextmanager
async def consuming(
    url: str, component: str, handle: Callable[[StreamEvent], Any], on_ready: Any = None
) -> Any:
    """tidings' consume() (push) in a task, cancelled on leaving."""
    task = asyncio.create_task(consume(url, USER, PASSWORD, component, handle, on_ready=on_ready))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def python_drain(url: str, component: str, count: int) -> float:
    """Seconds tidings' consume() takes from its start to the ``count``-th event."""
    handled = 0
    done = asyncio.Event()

    async def handle(event: StreamEvent) -> None:
        nonlocal handled
        handled += 1
        if handled >= count:
            done.set()

    started = time.perf_counter()
    async with consuming(url, component, handle) as task:
        await until_done(done, task, 300)
        return time.perf_counter() - started


async def jetstream_fill(js: Any, count: int) -> None:
    """A marker message then ``count`` messages, the same JSON as the event data."""
    await js.add_stream(name=JS_STREAM, subjects=[JS_SUBJECT])
    await js.publish(JS_SUBJECT, json.dumps({"marker": True}).encode())
    for start in range(1, count + 1, 5000):
        acks = [
            await js.publish_async(JS_SUBJECT, json.dumps(event_data(i)).encode())
            for i in range(start, min(start + 5000, count + 1))
        ]
        await asyncio.gather(*acks)


async def jetstream_drain(js: Any, durable: str, count: int) -> float:
    """Seconds a new durable pull consumer takes to fetch, decode and acknowledge ``count``
    messages (batches of 1,000, the last of each acknowledged: AckPolicy.ALL)."""
    config = ConsumerConfig(ack_policy=AckPolicy.ALL)
    started = time.perf_counter()
    sub = await js.pull_subscribe(JS_SUBJECT, durable=durable, stream=JS_STREAM, config=config)
    got = 0
    while got < count:
        msgs = await sub.fetch(1000, timeout=5)
        for msg in msgs:
            json.loads(msg.data)
        await msgs[-1].ack()
        got += len(msgs)
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    return elapsed


async def phase_drains(
    tidings_url: str, tidings_pid: int, js: Any, nats_pid: int, sizes: StreamsSizes, report: Report
) -> None:
    """Both consumers drain the same number of events, runs interleaved; the medians."""
    count = sizes.py_events + 1
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {"python": [], "jetstream": []}
    for run in range(1, sizes.py_runs + 1):
        window = measure_cpu(tidings_pid)
        seconds = await python_drain(tidings_url, f"PYDRAIN{run}", count)
        runs["python"].append((seconds, window.stop()))
        window = measure_cpu(nats_pid)
        seconds = await jetstream_drain(js, f"drain{run}", count)
        runs["jetstream"].append((seconds, window.stop()))
        say(
            f"  run {run}: tidings consume() {count / runs['python'][-1][0]:,.0f} ev/s, "
            f"JetStream pull {count / runs['jetstream'][-1][0]:,.0f} ev/s"
        )
    for name, key, client in (
        ("python", "python_consume_ev_s", "the Python consumer"),
        ("jetstream", "jetstream_pull_ev_s", "the nats-py consumer"),
    ):
        seconds, usage = sorted(runs[name])[len(runs[name]) // 2]
        report.figures[key] = round(count / seconds)
        rates = ", ".join(f"{count / s:,.0f}" for s, _ in runs[name])
        report.detail("python", f"{key}: {count:,} events per run; runs {rates} ev/s")
        record_cpu(report, key, usage, seconds, usage["bench_cpu_s"], client)
