"""A target down for a while, then back: the running relay delivers everything afterwards,
in per-key order, exactly once. The target is a private, real ``nats-server`` that the test
kills and restarts on the same storage."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from helpers import PrivateServer, free_port, relay_config, stream_messages
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.relay import run_relay

pytestmark = [pytest.mark.spark, pytest.mark.nats]


def _statuses(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [
            r[0] for r in conn.execute(select(outbox_event.c.status).order_by(outbox_event.c.seq))
        ]


def _wait(predicate, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.2)


def test_target_down_then_back_everything_delivered_in_order(spark, tmp_path: Path) -> None:
    server = PrivateServer(free_port(), tmp_path / "jetstream")
    server.start()
    try:
        _run_outage(spark, tmp_path, server)
    finally:
        server.kill()


def _run_outage(spark, tmp_path: Path, server: PrivateServer) -> None:
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
            }
        },
        routes={"Moved": ["js"]},
        retry_backoff=["1ms", "2ms"],
        replay_every="1s",
    )
    config = config.model_copy(
        update={
            "replay": config.replay.model_copy(update={"older_than": config.replay.older_than * 0})
        }
    )
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    keys: dict[str, str] = {}

    def emit(n: int) -> None:
        for i in range(n):
            with outbox.transaction() as tx:
                key = f"k{i % 5}"
                keys[tx.emit("Moved", {"i": i}, partition_key=key)] = key

    stop = threading.Event()
    relay = threading.Thread(target=run_relay, args=(spark, config), kwargs={"stop": stop})
    relay.start()
    try:
        emit(40)
        _wait(lambda: set(_statuses(engine)) == {"PUBLISHED"})
        server.kill()
        emit(60)
        _wait(lambda: "PENDING" not in _statuses(engine))  # relayed while the target is down
        during = _statuses(engine)[40:]
        assert "FAILED" in during and "PUBLISHED" not in during
        assert set(during) <= {"FAILED", "HELD"}
        server.start()  # back, same storage
        _wait(lambda: set(_statuses(engine)) == {"PUBLISHED"})
        emit(20)
        _wait(lambda: len(_statuses(engine)) == 120 and set(_statuses(engine)) == {"PUBLISHED"})
    finally:
        stop.set()
        relay.join(60)
    delivered = [m.headers["Nats-Msg-Id"] for m in stream_messages(stream, server.url)]
    with engine.connect() as conn:
        order = [
            r[0] for r in conn.execute(select(outbox_event.c.event_id).order_by(outbox_event.c.seq))
        ]
    assert sorted(delivered) == sorted(order)  # every event, each exactly once
    for key in set(keys.values()):
        assert [e for e in delivered if keys[e] == key] == [e for e in order if keys[e] == key]
