"""A target down for a while, then back: the running relay delivers everything afterwards,
in per-key order, exactly once. The target is a private, real ``nats-server`` that the test
kills and restarts on the same storage."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from helpers import PrivateServer, free_port, relay_config, statuses, stream_messages, wait_until
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.relay import run_relay

pytestmark = [pytest.mark.spark, pytest.mark.nats]


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
        wait_until(lambda: set(statuses(engine).values()) == {"PUBLISHED"})
        server.kill()
        emit(60)
        wait_until(
            lambda: "PENDING" not in statuses(engine).values()
        )  # relayed while the target is down
        during = list(statuses(engine).values())[40:]
        assert "FAILED" in during and "PUBLISHED" not in during
        assert set(during) <= {"FAILED", "HELD"}
        server.start()  # back, same storage
        wait_until(lambda: set(statuses(engine).values()) == {"PUBLISHED"})
        emit(20)
        wait_until(
            lambda: len(statuses(engine)) == 120 and set(statuses(engine).values()) == {"PUBLISHED"}
        )
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
