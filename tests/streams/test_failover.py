"""Stream consumers across the failover of a redundant pair: real servers as child processes
on their own SQLite files, the active one SIGKILLed while consumers are part-way through.

A consumer that moves to the other server continues from its last acknowledged position
there: every event arrives at least once, in order per key, and the duplicates stay within
what was in flight (the streams guide states the bound). Without the shared positions, the
consumer would start again from the beginning on the other server: hundreds of duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.support.child_parts import ChildPart
from tests.support.stream_helpers import PASSWORD, USER, FutoInClient
from tests.support.stream_pair import (
    PUSH,
    Producer,
    check_delivery,
    items,
    start_pair,
    stream_count,
)
from tests.support.waiting import run, until
from tidings.streams.client import StreamEvent, consume

pytestmark = pytest.mark.slow

#: Events a push consumer may get twice after a failover: the groups in flight, and one
#: group more whose acknowledgement the Syncer had not yet carried to the peer when the
#: active server died (a group takes the slow consumers here far longer than a Syncer hop).
PUSH_BOUND = (PUSH["max_in_flight"] + 1) * PUSH["max_group_events"]
FIRST, SECOND = 400, 200


def test_python_and_cli_consumers_resume_on_the_peer_after_a_kill(tmp_path: Path) -> None:
    a, b = start_pair(tmp_path)
    login = {"TIDINGS_STREAM_USER": USER, "TIDINGS_STREAM_PASSWORD": PASSWORD}
    polled = ChildPart(
        "polled", ["consume", f"{a.url},{b.url}", "POLLED", "--poll"], tmp_path, login
    )
    producer = Producer()
    pushed: list[tuple[int, int]] = []
    go = asyncio.Event()

    async def slow(event: StreamEvent) -> None:
        # Held until the first part is all sent, then slow: part-way, with groups in
        # flight, at the kill.
        await go.wait()
        await asyncio.sleep(0.01)
        pushed.append((event.data["k"], event.data["n"]))

    async def scenario() -> None:
        consumer = asyncio.create_task(
            consume([a.url, b.url], USER, PASSWORD, "PUSHED", slow, connect_timeout=30)
        )
        try:
            polled.start()
            await producer.send(a.url, FIRST)
            await _until_async(lambda: stream_count(b.url), FIRST, 30)  # B has synced them
            go.set()
            await until(lambda: len(pushed) >= FIRST // 3, 30)
            assert len(pushed) < FIRST, "the push consumer was to be part-way at the kill"
            a.part.kill()
            await producer.send(b.url, SECOND)
            await until(lambda: set(pushed) >= set(producer.sent), 60)
            await until(lambda: set(items(polled.lines())) >= set(producer.sent), 60)
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer

    try:
        run(scenario(), timeout=150)
        assert check_delivery(pushed, producer.sent) <= PUSH_BOUND
        # The poll consumer had acknowledged all but its last reply, which held what came
        # within one poll interval of the end of the first part (the producer had stopped).
        assert check_delivery(items(polled.lines()), producer.sent) <= PUSH["max_group_events"]
        assert "stream connection lost" in polled.log.read_text()
    finally:
        for part in (polled, a.part, b.part):
            part.stop()


def test_futoin_reliable_receiver_pointed_at_the_peer_resumes(tmp_path: Path) -> None:
    a, b = start_pair(tmp_path)
    producer = Producer()

    async def scenario() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        options = {"mode": "reliable", "creds": f"{USER}:{PASSWORD}", "component": "FUT"}
        await producer.send(a.url, FIRST)
        await _until_async(lambda: stream_count(b.url), FIRST, 30)
        first = await FutoInClient(url="ws" + a.url[4:], **options).start()
        try:
            await first.wait_events(FIRST, 30)
            a.part.kill()
        finally:
            await first.kill()
        await producer.send(b.url, SECOND)
        second = await FutoInClient(url="ws" + b.url[4:], **options).start()
        try:
            await until(lambda: set(items(second.events)) >= set(producer.sent[FIRST:]), 30)
            assert not second.errors, second.errors
        finally:
            await second.kill()
        return items(first.events), items(second.events)

    try:
        before, after = run(scenario(), timeout=120)
        assert before == producer.sent[:FIRST]
        # On the peer it resumed where it had acknowledged: the first part again only as
        # far as it was in flight, never from the beginning.
        again = [item for item in after if item in set(before)]
        assert len(again) <= PUSH_BOUND, f"{len(again)} events of the first part again"
        check_delivery(before + after, producer.sent)
    finally:
        for part in (a.part, b.part):
            part.stop()


async def _until_async(read: Callable[[], Awaitable[int]], want: int, timeout: float) -> None:
    """Wait until ``read()`` gives at least ``want``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (got := await read()) < want:
        assert loop.time() < deadline, f"only {got} of {want} within {timeout} s"
        await asyncio.sleep(0.1)
