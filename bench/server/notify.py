"""The notify step: register one event at a time until a second, subscribed client receives
its notify."""

from __future__ import annotations

import asyncio
import contextlib
import time

from hat.event import eventer

from bench.harness.figures import percentile
from bench.server.servers import Run
from bench.server.workload import (
    NOTIFY_PATTERN,
    ServerSizes,
    WrongAnswer,
    check,
    check_registered,
    reg_event,
)


async def notify_latency(client: eventer.Client, run: Run, sizes: ServerSizes) -> None:
    subscriber = await eventer.connect(run.server.address, [NOTIFY_PATTERN])
    arrivals: dict[int, float] = {}
    waiting: dict[int, asyncio.Future[float]] = {}
    problems: list[str] = []

    async def receive() -> None:
        while True:
            events = await subscriber.receive()
            now = time.perf_counter()
            for event in events:
                if event.event_type[:2] != ("bench", "n") or event.payload is None:
                    problems.append(f"notify of an unsubscribed event {event.event_type}")
                    continue
                seq = event.payload.data["seq"]
                if seq in arrivals:
                    problems.append(f"notify of seq {seq} twice")
                arrivals[seq] = now
                future = waiting.pop(seq, None)
                if future is not None and not future.done():
                    future.set_result(now)

    receiver = asyncio.create_task(receive())
    try:
        # The subscription is sent right after connecting; wait until it is in effect.
        warm = -1
        while True:
            future = waiting[warm] = asyncio.get_running_loop().create_future()
            await client.register_with_response([reg_event(("bench", "n", "x"), {"seq": warm})])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(future), 0.5)
                break
            warm -= 1
            check(warm > -20, "the subscriber received no notify within 10 s")
        latencies: list[float] = []
        loop = asyncio.get_running_loop()
        for seq in range(sizes.notify_events):
            future = waiting[seq] = loop.create_future()
            event = reg_event(("bench", "n", f"k{seq % 10}"), {"seq": seq})
            started = time.perf_counter()
            results = await client.register_with_response([event])
            try:
                arrived = await asyncio.wait_for(future, 10)
            except TimeoutError:
                raise WrongAnswer(f"no notify for seq {seq} within 10 s") from None
            latencies.append((arrived - started) * 1000)
            check_registered(results, [event])
        run.last_event = results[-1]
        await asyncio.sleep(0.1)  # anything stray would arrive now
        check(not problems, f"notify: {problems[:3]}")
        check(
            set(range(sizes.notify_events)) <= set(arrivals),
            "notify: events missing",
        )
        run.record("notify_p50_ms", percentile(latencies, 50))
        run.record("notify_p99_ms", percentile(latencies, 99))
    finally:
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await receiver
        await subscriber.async_close()
