"""Custom headers survive every target kind: one relay run on Spark delivers emitted events
to the embedded event store, a ``tidings server`` process, JetStream (the shared server at
:4222) and Redis Streams (:6379), and each test reads the headers back as that target's
consumers read events.

The headers travel in the CloudEvents envelope (:mod:`tidings.outbox.envelope`); JetStream
carries them as NATS headers too, Redis as the entry's ``headers`` field. (MQTT is not here:
``HEADERS`` holds a tab, which an MQTT user property cannot; tests/targets/kinds/test_mqtt.py
reads its headers as user properties.)
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from nats.aio.msg import Msg

from bench.harness.processes import ServerProcess, free_port
from tests.support.helpers import (
    admin,
    delete_stream,
    relay_config,
    statuses,
    store_events,
    store_target,
)
from tests.support.waiting import run
from tidings.client import connect
from tidings.config import TidingsConfig
from tidings.db import make_engine
from tidings.events.model import StoredEvent
from tidings.events.query import QueryData
from tidings.outbox.envelope import envelope_headers
from tidings.outbox.producer import Outbox
from tidings.pipeline.relay_query import start_relay

pytestmark = [
    pytest.mark.spark,
    pytest.mark.nats,
    pytest.mark.redis,
    pytest.mark.sockets,
]

#: Headers of every sort: CloudEvents-shaped names (attributes of their own), names
#: CloudEvents cannot take or the envelope uses, a value with a tab, a long name.
HEADERS = {
    "tenant": "eu",
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "Aggregate-Type": "order",
    "type": "not the event type",
    "note": "tab\there",
    "a_rather_long_header_name": "ü",
}


@dataclass(frozen=True)
class Delivered:
    """What the relay run delivered: the config, the server, the stream and its subjects'
    prefix, the event ids (the first with ``HEADERS``, the second with none)."""

    config: TidingsConfig
    server: ServerProcess
    stream: str
    subjects: str
    ids: tuple[str, str]
    tag: str


@pytest.fixture(scope="module")
def delivered(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Delivered]:
    workdir = tmp_path_factory.mktemp("headers")
    server = ServerProcess.tidings(workdir / "server", 1, {"eventer": free_port()})
    tag = uuid.uuid4().hex[:12]
    stream, subjects = f"TIDINGS_HEADERS_{tag}", f"tidings_hdr.{tag}"
    targets = {
        "store": store_target(workdir),
        "remote": {"kind": "event_server", "address": server.eventer, "type_prefix": ["t"]},
        "js": {"kind": "jetstream", "stream": stream, "subject_prefix": subjects},
        "redis": {"kind": "redis_stream", "stream": f"tidings-hdr:{tag}"},
    }
    config = relay_config(workdir, targets=targets, routes={"Created": list(targets)})
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    server.start()
    try:
        with outbox.transaction() as tx:
            first = tx.emit("Created", {"n": 1}, partition_key="k", headers=HEADERS)
            second = tx.emit("Created", {"n": 2}, partition_key="k")
        start_relay(spark, config, available_now=True).awaitTermination()
        assert set(statuses(engine).values()) == {"PUBLISHED"}
        yield Delivered(config, server, stream, subjects, (first, second), tag)
    finally:
        server.stop()
        delete_stream(stream)
        redis.Redis().delete(f"tidings-hdr:{tag}")


def _envelopes(payloads: list[bytes | None]) -> list[dict[str, Any]]:
    return [json.loads(payload or b"") for payload in payloads]


def test_the_event_stores_readers_read_the_headers(delivered: Delivered) -> None:
    stored = store_events(delivered.config)
    assert [e.outbox_event_id for e in stored] == list(delivered.ids)
    first, second = _envelopes([e.payload for e in stored])
    assert envelope_headers(first) == HEADERS
    assert first["tenant"] == "eu" and first["type"] == "Created"
    assert envelope_headers(second) == {}


def test_the_event_servers_clients_read_the_headers(delivered: Delivered) -> None:
    async def query() -> list[StoredEvent]:
        async with await connect(delivered.server.eventer) as client:
            return await client.query(QueryData(event_types=(("t", "*"),), order="ascending"))

    first, second = _envelopes([e.payload for e in run(query())])
    assert [first["id"], second["id"]] == list(delivered.ids)
    assert envelope_headers(first) == HEADERS
    assert envelope_headers(second) == {}


def test_jetstream_consumers_read_the_headers_as_nats_headers_and_in_the_envelope(
    delivered: Delivered,
) -> None:
    """Read as a consumer reads: a pull subscription on the stream."""

    async def consume(js: Any) -> list[Msg]:
        subscription = await js.pull_subscribe(f"{delivered.subjects}.>", stream=delivered.stream)
        messages: list[Msg] = await subscription.fetch(2, timeout=10)
        for message in messages:
            await message.ack()
        return messages

    first, second = admin(consume)
    assert first.headers is not None and second.headers is not None
    assert {k: first.headers[k] for k in HEADERS} == HEADERS
    assert first.headers["Nats-Msg-Id"] == delivered.ids[0]
    envelopes = _envelopes([first.data, second.data])
    assert envelope_headers(envelopes[0]) == HEADERS
    assert envelope_headers(envelopes[1]) == {}


def test_redis_consumers_read_the_headers_as_a_field_and_in_the_envelope(
    delivered: Delivered,
) -> None:
    first, second = redis.Redis().xrange(f"tidings-hdr:{delivered.tag}")
    assert first[1][b"event_id"].decode() == delivered.ids[0]
    assert json.loads(first[1][b"headers"]) == HEADERS
    assert b"headers" not in second[1]
    envelopes = _envelopes([first[1][b"payload"], second[1][b"payload"]])
    assert envelope_headers(envelopes[0]) == HEADERS
    assert envelope_headers(envelopes[1]) == {}
