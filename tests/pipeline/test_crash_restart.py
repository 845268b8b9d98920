"""The relay process tree SIGKILLed at random points during a large run, then restarted.

Every routed event must end on every target exactly once (the embedded event store and a
real JetStream stream), in per-key order, and every row must be PUBLISHED.
"""

from __future__ import annotations

import random
import subprocess
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from bench.harness.processes import kill_tree, tidings_cli
from tests.support.helpers import (
    delete_stream,
    relay_config,
    store_events,
    store_target,
    stream_messages,
    write_config,
)
from tests.support.waiting import wait_until
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.nats]

EVENTS = 12_000
KEYS = 40


def _start_relay(config_path: Path, log: Path) -> subprocess.Popen[bytes]:
    return tidings_cli(
        "relay",
        "--config",
        str(config_path),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the JVM dies with it
    )


def _published(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            select(func.count()).where(outbox_event.c.status == "PUBLISHED")
        ).scalar_one()


def _wait_published(
    engine: Engine,
    count: int,
    relay: subprocess.Popen[bytes],
    log: Path,
    *,
    timeout: float,
    interval: float,
) -> None:
    """Wait until ``count`` rows are PUBLISHED; fail at once if the relay died meanwhile."""

    def reached() -> bool:
        if _published(engine) >= count:
            return True
        assert relay.poll() is None, log.read_text()[-3000:]
        return False

    wait_until(reached, timeout, interval=interval, explain=lambda: log.read_text()[-3000:])


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
    config_path = write_config(config, tmp_path / "tidings.yaml")
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
        _wait_published(engine, target, proc, log, timeout=300, interval=0.05)
        kill_tree(proc)
    proc = _start_relay(config_path, log)
    try:
        _wait_published(engine, EVENTS, proc, log, timeout=600, interval=0.5)
    finally:
        kill_tree(proc)
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

    check([e.outbox_event_id for e in store_events(config)])
    messages = stream_messages(stream)
    delete_stream(stream)
    check([m.headers["Nats-Msg-Id"] for m in messages])
