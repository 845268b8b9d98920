"""A target down under steady traffic, then back: the streaming relay alone (no scheduled
replay) resumes every held key, in per-key order, exactly once, while a healthy second target
keeps receiving throughout. The failing target is a private, real ``nats-server`` that the
test kills and restarts on the same storage; the healthy one is the embedded event store."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from bench.harness.processes import NatsServer, free_port
from tests.support.helpers import (
    relay_config,
    statuses,
    store_events,
    store_target,
    stream_messages,
)
from tests.support.waiting import wait_until
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.relay import run_relay

pytestmark = [pytest.mark.spark, pytest.mark.nats]
KEYS = 10


def test_outage_under_traffic_recovers_by_the_relay_alone(spark, tmp_path: Path) -> None:
    server = NatsServer(free_port(), tmp_path / "jetstream")
    server.start()
    try:
        _run_outage(spark, tmp_path, server)
    finally:
        server.kill()


class _Producer(threading.Thread):
    """Emits one event every few milliseconds, round-robin over the keys, until stopped."""

    def __init__(self, outbox: Outbox) -> None:
        super().__init__(daemon=True)
        self.outbox = outbox
        self.keys: dict[str, str] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            with self.outbox.transaction() as tx:
                key = f"k{i % KEYS}"
                self.keys[tx.emit("Moved", {"i": i}, partition_key=key)] = key
            i += 1
            time.sleep(0.01)


def _run_outage(spark, tmp_path: Path, server: NatsServer) -> None:
    stream = f"OUTAGE_{uuid.uuid4().hex[:8]}"
    config = relay_config(
        tmp_path,
        targets={
            "js": {
                "kind": "jetstream",
                "servers": [server.url],
                "stream": stream,
                "subject_prefix": "outage",
                "ack_timeout": "1s",
            },
            "store": store_target(tmp_path),
        },
        routes={"Moved": ["js", "store"]},
        replay_every=None,  # the streaming relay alone must resume the held keys
    )
    engine = make_engine(config.database.url)
    producer = _Producer(Outbox(engine))
    stop = threading.Event()
    relay = threading.Thread(target=run_relay, args=(spark, config), kwargs={"stop": stop})
    relay.start()
    try:
        producer.start()
        wait_until(lambda: list(statuses(engine).values()).count("PUBLISHED") >= 50)
        server.kill()
        killed_at = max(statuses(engine))
        time.sleep(5)
        # The healthy target went on receiving while the other was down.
        wait_until(lambda: len(store_events(config)) > killed_at + 100)
        during = _rows(engine, after=killed_at)
        assert during and {r.status for r in during} <= {"HELD", "PUBLISHED", "PENDING"}
        assert not _charged(during)  # a down target charges no retries
        server.start()  # back, same storage
        time.sleep(3)
        producer.stop.set()
        producer.join()
        total = len(producer.keys)
        wait_until(
            lambda: (
                len(statuses(engine)) == total and set(statuses(engine).values()) == {"PUBLISHED"}
            )
        )
    finally:
        producer.stop.set()
        stop.set()
        relay.join(60)
    with engine.connect() as conn:
        order = [r[0] for r in conn.execute(select(outbox_event.c.event_id).order_by("seq"))]
    delivered = [m.headers["Nats-Msg-Id"] for m in stream_messages(stream, server.url)]
    assert sorted(delivered) == sorted(order)  # every event, each exactly once
    stored = [e.outbox_event_id for e in store_events(config)]
    assert sorted(stored) == sorted(order)
    keys = producer.keys
    for key in {f"k{i}" for i in range(KEYS)}:
        expected = [e for e in order if keys[e] == key]
        assert [e for e in delivered if keys[e] == key] == expected
        assert [e for e in stored if keys[e] == key] == expected
    assert not _charged(_rows(engine, after=0))


def _rows(engine, after: int) -> list:
    with engine.connect() as conn:
        return conn.execute(select(outbox_event).where(outbox_event.c.seq > after)).all()


def _charged(rows: list) -> list:
    """The rows charged a retry, with what their targets said (for the failure message)."""
    return [(r.seq, r.retry_count, r.deliveries) for r in rows if r.retry_count]
