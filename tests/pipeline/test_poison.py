"""One event a target will always refuse must fail alone (guarantee 5).

The poison is just under ``outbox.max_payload_bytes`` (accepted by an outbox that does not
know the routes), routed to JetStream, where payload plus headers exceed the real NATS
server's ``max_payload``. It shares its relay task with twenty other keys; only it may fail,
with the real cause recorded, and no innocent event may be charged a retry, also after
replays ran."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from tests.support.helpers import relay_config, stream_messages
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.relay import run_relay
from tidings.pipeline.replay import ReplayLimits, run_replay

pytestmark = [pytest.mark.spark, pytest.mark.nats]
KEYS = 21
PER_KEY = 6
BODY = 1_048_512  # bytes: under the default max_payload_bytes, over it with the headers


def test_a_near_limit_poison_fails_alone_among_other_keys(spark, tmp_path: Path) -> None:
    stream = f"POISON_{uuid.uuid4().hex[:8]}"
    config = relay_config(
        tmp_path,
        targets={
            "js": {"kind": "jetstream", "stream": stream, "subject_prefix": f"p{stream[-8:]}"}
        },
        routes={"Moved": ["js"]},
        partitions=1,  # every key in the same task, so the same publish calls
        retry={"backoff": ["1ms", "1ms", "1ms"]},
        replay_every=None,
    )
    engine = make_engine(config.database.url)
    outbox = Outbox(engine, transformer=lambda draft: draft.payload)
    poison_id = None
    for i in range(PER_KEY):
        for k in range(KEYS):
            with outbox.transaction() as tx:
                payload = "x" * (BODY - 2) if (k, i) == (0, 2) else {"k": k, "i": i}
                event_id = tx.emit("Moved", payload, partition_key=f"k{k}")
                poison_id = event_id if (k, i) == (0, 2) else poison_id

    run_relay(spark, config, once=True)
    limits = ReplayLimits(timedelta(0), 20, timedelta(minutes=1), 100_000)
    for _ in range(2):
        run_replay(spark, config, limits=limits)

    with engine.connect() as conn:
        rows = conn.execute(select(outbox_event).order_by(outbox_event.c.seq)).all()
    poison = next(r for r in rows if r.event_id == poison_id)
    assert poison.status == "FAILED" and poison.retry_count > 0
    error = json.loads(poison.error_details)["js"]
    assert "over the NATS server's max_payload of 1048576 bytes" in error
    assert f"payload {BODY}" in error
    behind = [r for r in rows if r.partition_key == "k0" and r.seq > poison.seq]
    assert len(behind) == PER_KEY - 3 and {r.status for r in behind} == {"HELD"}
    innocent = [r for r in rows if r.event_id != poison_id and r not in behind]
    assert {r.status for r in innocent} == {"PUBLISHED"}
    assert all(r.retry_count == 0 for r in rows if r.event_id != poison_id)

    delivered = [m.headers["Nats-Msg-Id"] for m in stream_messages(stream)]
    assert sorted(delivered) == sorted(r.event_id for r in innocent)  # each once
    for k in range(KEYS):
        key = f"k{k}"
        expected = [r.event_id for r in innocent if r.partition_key == key]
        assert [e for e in delivered if e in set(expected)] == expected
