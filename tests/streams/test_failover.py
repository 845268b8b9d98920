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
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bench.harness.processes import ServerProcess, free_port
from tests.support.child_parts import ChildPart
from tests.support.stream_helpers import (
    ALLOW,
    BILLING,
    BILLING_HASH,
    BILLING_SEC,
    PASSWORD,
    USER,
    FutoInClient,
    call,
    poll,
)
from tests.support.stream_pair import (
    KEYS,
    PUSH,
    Producer,
    check_delivery,
    items,
    serving,
    start_pair,
    stream_count,
)
from tests.support.waiting import run, until, wait_until
from tidings.events.model import EventId, NewEvent, json_event
from tidings.server.store import EventStore
from tidings.streams.client import StreamEvent, consume

pytestmark = pytest.mark.slow

#: Events a push consumer may get twice after a failover: the groups in flight, and one
#: group more whose acknowledgement the Syncer had not yet carried to the peer when the
#: active server died (a group takes the slow consumers here far longer than a Syncer hop).
PUSH_BOUND = (PUSH["max_in_flight"] + 1) * PUSH["max_group_events"]
REGISTER = "futoin.evt.poll:1.1:registerConsumer"
POLL = "futoin.evt.poll:1.1:pollEvents"
ADD = "futoin.evt.gen:1.1:addEvent"
FIRST, SECOND = 400, 200


def held_then_slow() -> tuple[
    list[tuple[int, int]], asyncio.Event, Callable[[StreamEvent], Awaitable[None]]
]:
    """A push consumer's callback held until ``go`` is set (the first part all sent), then
    slow: part-way, with groups in flight, at the kill. Returns the (key, n) it got in order,
    ``go`` and the callback."""
    pushed: list[tuple[int, int]] = []
    go = asyncio.Event()

    async def slow(event: StreamEvent) -> None:
        await go.wait()
        await asyncio.sleep(0.01)
        pushed.append((event.data["k"], event.data["n"]))

    return pushed, go, slow


def test_python_and_cli_consumers_resume_on_the_peer_after_a_kill(tmp_path: Path) -> None:
    a, b = start_pair(tmp_path)
    login = {"TIDINGS_STREAM_USER": USER, "TIDINGS_STREAM_PASSWORD": PASSWORD}
    polled = ChildPart(
        "polled", ["consume", f"{a.url},{b.url}", "POLLED", "--poll"], tmp_path, login
    )
    producer = Producer()
    pushed, go, slow = held_then_slow()

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
        duplicates = check_delivery(pushed, producer.sent)
        print(f"push consumer: {duplicates} duplicates")
        assert duplicates <= PUSH_BOUND
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
        print(f"ReliableReceiver: {len(again)} duplicates")
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


def test_a_consumer_follows_the_blessing_of_a_monitor_group(tmp_path: Path) -> None:
    """BLESS_ONE: only the blessed server serves its streams; killed, the other is blessed,
    starts its streams (catching up on the consumer events it synced meanwhile), and the
    consumer resumes there."""
    monitor_port = free_port()
    monitor = ServerProcess.hat_monitor(tmp_path / "monitor", monitor_port, "BLESS_ONE")
    monitor.start(20)
    a, b = start_pair(tmp_path, monitor_port)
    producer = Producer()
    pushed, go, slow = held_then_slow()

    try:
        wait_until(lambda: [serving(a), serving(b)].count(True) == 1, 30)
        time.sleep(1)  # the Monitor settled: still exactly one serves
        [active] = [server for server in (a, b) if serving(server)]
        standby = b if active is a else a

        def synced() -> bool:  # the standby's store, read as a file: it serves no stream
            with contextlib.closing(sqlite3.connect(f"{tmp_path}/{standby.part.name}.db")) as db:
                [(count,)] = db.execute(
                    "SELECT count(*) FROM event_events WHERE type = ?", ('["orders","created"]',)
                )
            return int(count) >= FIRST

        async def scenario() -> float:
            consumer = asyncio.create_task(
                consume([a.url, b.url], USER, PASSWORD, "PUSHED", slow, connect_timeout=30)
            )
            try:
                await producer.send(active.url, FIRST)
                await until(synced, 30)
                go.set()
                await until(lambda: len(pushed) >= FIRST // 3, 30)
                active.part.kill()
                killed = time.monotonic()
                await until(lambda: serving(standby), 30)
                took = time.monotonic() - killed
                await producer.send(standby.url, SECOND)
                await until(lambda: set(pushed) >= set(producer.sent), 60)
                return took
            finally:
                consumer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await consumer

        took = run(scenario(), timeout=150)
        duplicates = check_delivery(pushed, producer.sent)
        print(f"blessed in {took:.2f} s after the kill; {duplicates} duplicates")
        assert duplicates <= PUSH_BOUND
    finally:
        for part in (a.part, b.part):
            part.stop()
        monitor.stop()


def test_a_position_past_filtered_events_reaches_the_peer(tmp_path: Path) -> None:
    """The data filter holds events back from billing (:func:`access_config`'s user); its
    position moves past them on the server it polls, and the peer learns that position
    (the covers name the held-back events too: they count as delivered), so a consumer
    moving there neither gets the events it had nor holds retention back on them."""
    billing = {BILLING: {"password_hash": BILLING_HASH, "allow": ALLOW}}
    a, b = start_pair(tmp_path, users=billing)

    def positions(server: str) -> tuple[int, int]:
        """The server's stored position of billing's BILLING, and its own position of the
        last event held back from it."""
        with contextlib.closing(sqlite3.connect(f"{tmp_path}/{server}.db")) as db:
            consumer = db.execute(
                "SELECT last_id FROM stream_consumers WHERE user_name = ? AND component = ?",
                (BILLING, "BILLING"),
            ).fetchall()
            [(held_back,)] = db.execute(
                "SELECT max(position) FROM event_events WHERE CAST(payload AS TEXT) LIKE '%globex%'"
            ).fetchall()
        return (consumer[0][0] if consumer else -1), held_back or 0

    async def scenario() -> None:
        register = {"component": "BILLING"}
        assert await call(a.url, REGISTER, register, sec=BILLING_SEC) == {"r": True}
        ids = []
        for tenant in ("acme", "globex", "globex"):
            reply = await call(a.url, ADD, {"type": "ORDER", "data": {"tenant": tenant}})
            ids.append(int(reply["r"]))
        polled = await call(a.url, POLL, {"component": "BILLING"}, sec=BILLING_SEC)
        assert [int(e["id"]) for e in polled["r"]] == ids[:1]
        again = {"component": "BILLING", "last_id": str(ids[0])}
        assert (await call(a.url, POLL, again, sec=BILLING_SEC))["r"] == []
        position, held_back = positions("server1")
        assert position >= held_back == ids[2]

        def peer_knows() -> bool:
            position, held_back = positions("server2")
            return held_back > 0 and position >= held_back

        await until(peer_knows, 30)
        # On the peer: nothing again (neither the acme event nor the held-back ones).
        assert (await call(b.url, POLL, register, sec=BILLING_SEC))["r"] == []
        reply = await call(b.url, ADD, {"type": "ORDER", "data": {"tenant": "acme"}})
        polled = await call(b.url, POLL, register, sec=BILLING_SEC)
        assert [int(e["id"]) for e in polled["r"]] == [int(reply["r"])]

    try:
        run(scenario(), timeout=60)
    finally:
        for part in (a.part, b.part):
            part.stop()


def test_an_event_read_on_a_is_not_read_again_from_bs_own_copy(tmp_path: Path) -> None:
    """The relay sent the last events to A, lost A before A's Syncer carried them, and sent
    them again to B: both servers hold them, each under its own ids (the stores are laid out
    so before the servers start, as the relay would have left them). A consumer that read
    them on A, and had more in flight, moves to B: it gets again what was in flight, and
    nothing of what it had acknowledged, though B holds that under B's ids: each server
    recorded the other's skipped copy as another id of its own event."""
    relayed = [(i % KEYS, i // KEYS) for i in range(FIRST // 10)]
    stores = {n: EventStore(f"sqlite:///{tmp_path}/server{n}.db", n) for n in (1, 2)}
    try:
        on_a = stores[1].register([_relayed(item) for item in relayed])
        stores[2].append_synced(on_a[:10])  # A's Syncer carried these in time
        stores[2].register([_relayed(item) for item in relayed[10:]])  # the relay's second try
    finally:
        for store in stores.values():
            store.close()
    a, b = start_pair(tmp_path)
    producer = Producer()
    producer.sent = list(relayed)  # the next events continue each key

    async def scenario() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        await producer.send(a.url, KEYS)  # then A takes new events
        await _until_async(lambda: stream_count(b.url), len(producer.sent), 30)
        await call(a.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "C"})
        got = (await poll(a.url, "C"))["r"]
        assert items(got) == producer.sent
        # It acknowledges the relayed events only (so that its covers name none of B's own
        # events, which would cover B's copies without the copies' record); the new ones are
        # in flight when A dies.
        in_flight = (await poll(a.url, "C", on_a[-1].position))["r"]
        assert items(in_flight) == producer.sent[len(relayed) :]
        last = on_a[-1].id
        await until(lambda: _covers_of_a(tmp_path / "server2.db", "C") >= last, 30)
        a.part.kill()
        await producer.send(b.url, SECOND // 10)
        after: list[dict[str, Any]] = []
        while len(after) < len(producer.sent) - len(relayed):
            after += (await poll(b.url, "C", after[-1]["id"] if after else None))["r"]
        return items(got), items(after)

    try:
        before, after = run(scenario(), timeout=120)
        assert after == producer.sent[len(relayed) :]  # in flight again, then the new ones
        check_delivery(before + after, producer.sent)
    finally:
        for part in (a.part, b.part):
            part.stop()


def _relayed(item: tuple[int, int]) -> NewEvent:
    """Item ``(k, n)`` as the relay stores it on stream ``s``, with its outbox id."""
    key, n = item
    return json_event(("orders", "created"), {"k": key, "n": n}, outbox_event_id=f"o-{key}-{n}")


def _covers_of_a(database: Path, component: str) -> EventId:
    """How far of server 1's events consumer ``component`` has read, as the store in
    ``database`` knows it (read as a file: the server is running)."""
    with contextlib.closing(sqlite3.connect(database)) as db:
        found = db.execute(
            "SELECT session, instance FROM stream_consumer_covers WHERE component = ? "
            "AND server = 1",
            (component,),
        ).fetchone()
    return EventId(1, *found) if found else EventId(1, 0, 0)
