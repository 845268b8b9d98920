"""The relay process tree SIGKILLed at random points during a large run, then restarted.

Every routed event must end on every target exactly once (the embedded event store and a
real JetStream stream), in per-key order, and every row must be PUBLISHED.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nats
import pytest
import yaml
from sqlalchemy import func, select

from helpers import relay_config, store_target
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.server.store import EventStore

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.nats]

EVENTS = 12_000
KEYS = 40


def _start_relay(config_path: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tidings.cli", "relay", "--config", str(config_path)],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the JVM dies with it
    )


def _kill_tree(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def _published(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            select(func.count()).where(outbox_event.c.status == "PUBLISHED")
        ).scalar_one()


async def _jetstream_messages(stream: str, prefix: str, expected: int) -> list[tuple[str, str]]:
    nc = await nats.connect("nats://127.0.0.1:4222")
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(f"{prefix}.>", stream=stream)
        got: list[tuple[str, str]] = []
        while True:
            try:
                batch = await sub.fetch(1000, timeout=2)
            except TimeoutError:  # nats-py raises its own or asyncio's, depending on timing
                break
            for msg in batch:
                got.append((msg.headers["Nats-Msg-Id"], msg.headers.get("Tidings-Partition-Key")))
                await msg.ack()
        await js.delete_stream(stream)
        return got
    finally:
        await nc.close()


def test_sigkilled_relay_restarts_and_delivers_exactly_once_in_order(tmp_path: Path) -> None:
    stream, prefix = f"CRASH_{uuid.uuid4().hex[:8]}", f"crash{uuid.uuid4().hex[:8]}"
    config = relay_config(
        tmp_path,
        targets={
            "store": store_target(tmp_path),
            "nats": {"kind": "jetstream", "stream": stream, "subject_prefix": prefix},
        },
        routes={"Created": ["store", "nats"]},
        max_events_per_batch=1500,
        replay_every=None,
    )
    config_path = tmp_path / "tidings.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    rng = random.Random(42)
    keys = {}
    for i in range(0, EVENTS, 100):  # committed in transactions of 100 events
        with outbox.transaction() as tx:
            for j in range(i, i + 100):
                key = f"k{rng.randrange(KEYS)}"
                keys[tx.emit("Created", {"n": j}, partition_key=key)] = key
    log = tmp_path / "relay.log"
    # Kill the whole relay process tree at three points of progress (random within each
    # stretch): mid-batch, between the publish and the status update, wherever it is.
    for low, high in ((0.1, 0.3), (0.4, 0.6), (0.7, 0.9)):
        proc = _start_relay(config_path, log)
        target = max(int(EVENTS * rng.uniform(low, high)), _published(engine) + 1)
        deadline = time.monotonic() + 300
        while _published(engine) < target:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "relay made no progress"
            time.sleep(0.05)
        _kill_tree(proc)
    proc = _start_relay(config_path, log)
    try:
        deadline = time.monotonic() + 600
        while _published(engine) < EVENTS and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        _kill_tree(proc)
    assert _published(engine) == EVENTS, log.read_text()[-3000:]

    with engine.connect() as conn:
        order = [
            r[0] for r in conn.execute(select(outbox_event.c.event_id).order_by(outbox_event.c.seq))
        ]
    rank = {event_id: n for n, event_id in enumerate(order)}

    def check(delivered: list[str]) -> None:
        assert len(delivered) == EVENTS and set(delivered) == set(order)  # exactly once
        last: dict[str, int] = {}
        for event_id in delivered:
            key = keys[event_id]
            assert rank[event_id] > last.get(key, -1), f"key {key} out of order"
            last[key] = rank[event_id]

    store = EventStore(config.targets["store"].url)
    try:
        check([e.outbox_event_id for e in store.read(0, EVENTS * 2)])
    finally:
        store.close()
    messages = asyncio.run(_jetstream_messages(stream, prefix, EVENTS))
    check([msg_id for msg_id, _ in messages])
