"""The Redis Streams target against real redis-server processes.

Most tests use the shared server on 127.0.0.1:6379, each on streams named with a tag of its
own, deleted afterwards. The size-limit, ACL, TLS and kill-and-restart tests run a private
``redis-server`` on a free port, so the shared server is never stopped or reconfigured.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

import tidings.targets.registry  # noqa: F401 - enters the target kinds into the config
from bench.harness.processes import free_port
from tests.support.brokers import PrivateServer, Traffic, first_seen_order, redis_server
from tests.support.certificates import TestCA
from tests.support.helpers import fresh_interpreter, relay_config, statuses
from tidings.config import load_config
from tidings.db import make_engine
from tidings.errors import ConfigError, TargetError, TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.relay_query import start_relay
from tidings.targets.kinds.redis_stream.config import RedisStreamTargetConfig
from tidings.targets.kinds.redis_stream.target import RedisStreamTarget

pytestmark = pytest.mark.redis

LOGGED_AT = datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=UTC)
SHARED = "redis://127.0.0.1:6379/0"


def event(seq: int, **fields: Any) -> OutboxEvent:
    """An event with a fresh id; ``fields`` override any attribute."""
    values: dict[str, Any] = {
        "seq": seq,
        "event_id": uuid.uuid4().hex,
        "event_type": "order.created",
        "payload": f'{{"n": {seq}}}',
        "logged_at": LOGGED_AT,
    }
    values.update(fields)
    return OutboxEvent(**values)


@pytest.fixture
def tag() -> Iterator[str]:
    """A stream-name prefix no other test uses; its keys on the shared server are deleted."""
    tag = f"tidings-test:{uuid.uuid4().hex[:12]}"
    yield tag
    shared = redis.Redis()
    keys = list(shared.scan_iter(f"{tag}*"))
    if keys:
        shared.delete(*keys)
    shared.close()


@pytest.fixture
def make_target(tag: str) -> Iterator[Callable[..., RedisStreamTarget]]:
    built: list[RedisStreamTarget] = []

    def make(**overrides: Any) -> RedisStreamTarget:
        settings: dict[str, Any] = {
            "kind": "redis_stream",
            "url": SHARED,
            "stream": f"{tag}:{{event_type}}",
            "timeout": "2s",
            **overrides,
        }
        target = RedisStreamTarget("rs-test", RedisStreamTargetConfig(**settings))
        built.append(target)
        return target

    yield make
    for target in built:
        target.close()


def entries(stream: str, url: str = SHARED) -> list[dict[str, str]]:
    """Every entry of ``stream``, its fields decoded, in stream order."""
    client = redis.Redis.from_url(url)
    try:
        found = client.xrange(stream)
    finally:
        client.close()
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in found]


# -- entries, streams, order --------------------------------------------------------------


def test_entries_hold_the_event_id_fields_headers_and_payload(
    make_target: Callable[..., RedisStreamTarget], tag: str
) -> None:
    full = event(
        1,
        payload='{"id": 1, "name": "Grüße"}',
        version="2",
        correlation_id="corr-1",
        originator="shop",
        partition_key="order-1",
        headers={"tenant": "acme", "payload": "not the payload"},
    )
    bare = event(2, event_type="OrderShipped")

    assert make_target().publish([full, bare]) == [None, None]

    (first,) = entries(f"{tag}:order.created")
    assert first == {
        "event_id": full.event_id,
        "event_type": "order.created",
        "version": "2",
        "seq": "1",
        "logged_at": "2024-05-17T09:30:15.123456+00:00",
        "correlation_id": "corr-1",
        "originator": "shop",
        "partition_key": "order-1",
        "headers": json.dumps({"tenant": "acme", "payload": "not the payload"}),
        "payload": '{"id": 1, "name": "Grüße"}',
    }
    (second,) = entries(f"{tag}:OrderShipped")
    assert set(second) == {"event_id", "event_type", "version", "seq", "logged_at", "payload"}


def test_streams_come_from_a_header_and_a_payload_field(
    make_target: Callable[..., RedisStreamTarget], tag: str
) -> None:
    target = make_target(stream=f"{tag}:{{headers.tenant}}:{{payload.region}}")
    eu = event(1, headers={"tenant": "acme"}, payload='{"region": "eu"}')
    us = event(2, headers={"tenant": "acme"}, payload='{"region": "us"}')

    assert target.publish([eu, us]) == [None, None]

    assert [e["event_id"] for e in entries(f"{tag}:acme:eu")] == [eu.event_id]
    assert [e["event_id"] for e in entries(f"{tag}:acme:us")] == [us.event_id]


def test_an_event_whose_stream_cannot_be_named_fails_alone_and_is_refused_at_emit(
    make_target: Callable[..., RedisStreamTarget], tag: str
) -> None:
    target = make_target(stream=f"{tag}:{{headers.tenant}}")
    good, missing = event(1, headers={"tenant": "a"}), event(2)

    results = target.publish([good, missing])

    assert results[0] is None
    assert results[1] == (
        f"redis_stream target 'rs-test': no stream for event {missing.event_id} (seq 2): "
        f"placeholder {{headers.tenant}} of '{tag}:{{headers.tenant}}': the event has no "
        "header 'tenant'"
    )
    assert target.refusal(missing) == results[1]
    assert target.refusal(good) is None


def test_a_key_goes_in_call_order_and_stops_at_its_refused_event(
    make_target: Callable[..., RedisStreamTarget], tag: str
) -> None:
    """Several events of a key in one call go one round after another; one Redis refuses
    (its stream's key holds a string: WRONGTYPE) fails alone, the rest of its key is not
    sent, and the other keys are stored in order."""
    redis.Redis().set(f"{tag}:poisoned", "not a stream")
    target = make_target(stream=f"{tag}:{{headers.to}}")
    k1 = [event(s, partition_key="k1", headers={"to": "s"}) for s in (1, 2, 3)]
    k1[1] = event(2, partition_key="k1", headers={"to": "poisoned"})
    k2 = [event(s, partition_key="k2", headers={"to": "s"}) for s in (4, 5, 6)]

    results = target.publish([k1[0], k2[0], k1[1], k2[1], k1[2], k2[2]])

    assert results[0] is None and results[1] is None and results[3] is None
    assert results[5] is None
    assert results[2] is not None and "WRONGTYPE" in results[2]
    assert results[4] is not None and "not sent: event seq 2 of its key failed" in results[4]
    stored = [(e["partition_key"], int(e["seq"])) for e in entries(f"{tag}:s")]
    assert [s for k, s in stored if k == "k1"] == [1]
    assert [s for k, s in stored if k == "k2"] == [4, 5, 6]


def test_maxlen_trims_each_stream(make_target: Callable[..., RedisStreamTarget], tag: str) -> None:
    target = make_target(maxlen=5, maxlen_approximate=False)

    assert target.publish([event(s) for s in range(1, 13)]) == [None] * 12

    assert [int(e["seq"]) for e in entries(f"{tag}:order.created")] == [8, 9, 10, 11, 12]


def test_publishing_from_many_threads_at_once(
    make_target: Callable[..., RedisStreamTarget], tag: str
) -> None:
    target = make_target()
    results: list[list[str | None]] = []

    def publish(base: int) -> None:
        results.append(target.publish([event(base + i) for i in range(200)]))

    threads = [threading.Thread(target=publish, args=(n * 1000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [r for batch in results for r in batch] == [None] * 800
    assert redis.Redis().xlen(f"{tag}:order.created") == 800


# -- sizes ------------------------------------------------------------------------------------


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[PrivateServer]:
    """A private server that takes bulk strings of 1 MiB at most (the least Redis allows)."""
    server = redis_server(tmp_path / "small", "--proto-max-bulk-len", "1mb")
    server.start()
    yield server
    server.kill()


def test_an_entry_over_proto_max_bulk_len_fails_alone_with_its_size(
    make_target: Callable[..., RedisStreamTarget], small_server: PrivateServer, tag: str
) -> None:
    url = f"redis://127.0.0.1:{small_server.port}/0"
    target = make_target(url=url)
    big = event(2, payload='"' + "x" * (1024 * 1024) + '"')
    assert target.refusal(big) is None  # not connected yet: Redis's default limit is assumed

    results = target.publish([event(1), big, event(3)])

    assert results[0] is None and results[2] is None
    assert results[1] is not None
    assert "field 'payload' is 1048578 bytes" in results[1]
    assert "proto-max-bulk-len of 1048576 bytes" in results[1]
    assert target.refusal(big) == results[1]  # learnt on connecting: refused at emit
    assert [int(e["seq"]) for e in entries(f"{tag}:order.created", url)] == [1, 3]


# -- outages ----------------------------------------------------------------------------------


def test_an_unreachable_server_is_unavailable(
    make_target: Callable[..., RedisStreamTarget],
) -> None:
    target = make_target(url=f"redis://127.0.0.1:{free_port()}/0")

    with pytest.raises(TargetUnavailable) as raised:
        target.publish([event(1)])

    assert "'rs-test'" in str(raised.value) and "cannot connect" in str(raised.value)
    assert target.publish([]) == []


def test_a_server_restarted_between_calls_is_not_felt(
    make_target: Callable[..., RedisStreamTarget], tmp_path: Path
) -> None:
    """redis-py's pool finds the connection the restart closed (it checks a connection for
    EOF as it hands it out) and connects afresh: the relay's breaker is not opened by a
    socket that was merely stale."""
    server = redis_server(tmp_path / "r")
    server.start()
    try:
        target = make_target(url=f"redis://127.0.0.1:{server.port}/0", stream="s")
        assert target.publish([event(1)]) == [None]
        server.kill()
        server.start()  # nothing kept: a fresh, empty server

        assert target.publish([event(2), event(3)]) == [None, None]

        assert [e["seq"] for e in entries("s", f"redis://127.0.0.1:{server.port}/0")] == ["2", "3"]
    finally:
        server.kill()


@pytest.mark.slow
def test_the_server_killed_and_restarted_under_traffic_loses_nothing_and_keeps_order(
    make_target: Callable[..., RedisStreamTarget], tmp_path: Path
) -> None:
    """A private server with an fsync'd append-only file is SIGKILLed twice while events of
    20 keys are being published as the relay would (what failed is sent again): once it is
    back, every event is in the stream, and a consumer dropping event ids it has seen reads
    each key's events in log order."""
    server = redis_server(tmp_path / "r", "--appendonly", "yes", "--appendfsync", "always")
    server.start()
    url = f"redis://127.0.0.1:{server.port}/0"
    target = make_target(url=url, stream="traffic", timeout="1s")
    events = [event(seq, partition_key=f"k{seq % 20}") for seq in range(1, 3001)]
    traffic = Traffic(target, events)
    try:
        traffic.start()
        for share in (0.3, 0.6):  # killed while events are still flowing
            traffic.wait_until(share)
            server.kill(signal.SIGKILL)
            time.sleep(0.5)
            server.start()
        traffic.join(180)
        assert traffic.error is None and traffic.failed_calls >= 1  # the kills were felt
        stored = entries("traffic", url)
    finally:
        server.kill()
    assert {e["event_id"] for e in stored} == {e.event_id for e in events}
    order = first_seen_order([(e["event_id"], e["partition_key"], int(e["seq"])) for e in stored])
    assert all(seqs == sorted(seqs) and len(seqs) == 150 for seqs in order.values())


# -- configuration, credentials, TLS ---------------------------------------------------------


def redis_config(**entry: Any) -> Any:
    target = {"kind": "redis_stream", "stream": "s", **entry}
    return load_config({"targets": {"rs": target}}).targets["rs"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"stream": "s:{aggregate}"}, "unknown placeholder {aggregate}"),
        ({"stream": ""}, "at least 1 character"),
        ({"url": "http://127.0.0.1:6379"}, "is not a redis:// or rediss:// URL"),
        ({"url": "redis://u:secret@127.0.0.1:6379"}, "give username and password_env instead"),
        ({"url": "redis://127.0.0.1:6379/x"}, "the database after the host must be a number"),
        ({"url": "redis://127.0.0.1:6379/0?ssl=true"}, "options in the URL are not read"),
        ({"maxlen": 0}, "maxlen"),
        ({"password_env": "NOT-A-NAME"}, "password_env"),
        ({"tls": {"verify": False}}, "the url is not rediss://"),
        ({"timeout": "forever"}, "not a duration"),
    ],
)
def test_a_bad_configuration_is_a_config_error_naming_it(
    entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        redis_config(**entry)

    assert "targets.rs" in str(raised.value) and message in str(raised.value)


def test_an_acl_user_with_its_password_from_the_environment(
    make_target: Callable[..., RedisStreamTarget],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = redis_server(
        tmp_path / "acl", "--user", "default", "off",
        "--user", "relay", "on", ">s3cret", "~orders:*", "+ping", "+xadd", "+config|get", "+client",
    )  # fmt: skip
    server.start()
    url = f"redis://127.0.0.1:{server.port}/0"
    try:
        monkeypatch.setenv("TIDINGS_TEST_REDIS_PASSWORD", "s3cret")
        target = make_target(
            url=url, username="relay", password_env="TIDINGS_TEST_REDIS_PASSWORD", stream="orders:x"
        )
        assert target.publish([event(1)]) == [None]
        # A stream the ACL keeps the user from: that event is refused, alone.
        other = make_target(
            url=url, username="relay", password_env="TIDINGS_TEST_REDIS_PASSWORD",
            stream="{headers.to}",
        )  # fmt: skip
        results = other.publish(
            [event(2, headers={"to": "audit"}), event(3, headers={"to": "orders:y"})]
        )
        assert results[0] is not None and "NOPERM" in results[0] and results[1] is None

        monkeypatch.setenv("TIDINGS_TEST_REDIS_PASSWORD", "wrong")
        with pytest.raises(TargetUnavailable, match="AuthenticationError"):
            make_target(
                url=url, username="relay", password_env="TIDINGS_TEST_REDIS_PASSWORD"
            ).publish([event(4)])
        monkeypatch.delenv("TIDINGS_TEST_REDIS_PASSWORD")
        with pytest.raises(TargetUnavailable, match="'TIDINGS_TEST_REDIS_PASSWORD' is not set"):
            make_target(
                url=url, username="relay", password_env="TIDINGS_TEST_REDIS_PASSWORD"
            ).publish([event(5)])
    finally:
        server.kill()


def test_tls_with_a_client_certificate(
    make_target: Callable[..., RedisStreamTarget], tmp_path: Path
) -> None:
    ca = TestCA(tmp_path / "pki")
    served, client = ca.server(), ca.client("relay")
    server = redis_server(
        tmp_path / "tls", "--tls-port", "{port}", "--port", "0",
        "--tls-cert-file", str(served.cert), "--tls-key-file", str(served.key),
        "--tls-ca-cert-file", str(ca.cert), "--tls-auth-clients", "yes",
    )  # fmt: skip
    server.start()
    url = f"rediss://127.0.0.1:{server.port}/0"
    tls = {"ca_file": str(ca.cert), "cert_file": str(client.cert), "key_file": str(client.key)}
    try:
        target = make_target(url=url, tls=tls, stream="secured")
        assert target.publish([event(1)]) == [None]
        with pytest.raises(TargetUnavailable, match="rs-test"):
            make_target(url=url, tls={"ca_file": str(ca.cert)}).publish([event(2)])
        with pytest.raises(TargetUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            make_target(url=url).publish([event(3)])  # the system CAs do not know ours
    finally:
        server.kill()


def test_close_is_final(make_target: Callable[..., RedisStreamTarget]) -> None:
    target = make_target()
    assert target.publish([event(1)]) == [None]
    target.close()
    with pytest.raises(TargetError, match="closed"):
        target.publish([event(2)])


@pytest.mark.spark
def test_the_relay_delivers_from_configuration_and_fails_only_the_event_without_a_stream(
    spark: Any, tag: str, tmp_path: Path
) -> None:
    target = {"kind": "redis_stream", "stream": f"{tag}:{{payload.data.region}}", "timeout": "2s"}
    config = relay_config(
        tmp_path, targets={"rs": target}, routes={"Created": ["rs"]}, retry={"backoff": ["1ms"]}
    )
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)  # no routed targets: the relay meets the bad event
    for n, region in enumerate(["eu", None, "eu", "us"]):
        with outbox.transaction() as tx:
            tx.emit("Created", {"n": n, "region": region}, partition_key=f"k{n}")

    start_relay(spark, config, available_now=True).awaitTermination()

    assert statuses(engine) == {1: "PUBLISHED", 2: "FAILED", 3: "PUBLISHED", 4: "PUBLISHED"}
    with engine.connect() as conn:
        error = conn.execute(
            select(outbox_event.c.error_details).where(outbox_event.c.seq == 2)
        ).scalar_one()
    assert "no stream for event" in error and "placeholder {payload.data.region}" in error
    eu = [json.loads(e["payload"])["data"]["n"] for e in entries(f"{tag}:eu")]
    assert eu == [0, 2]
    assert [e["seq"] for e in entries(f"{tag}:us")] == ["4"]


def test_validating_a_configuration_loads_neither_redis_py_nor_paho() -> None:
    """The registry imports every module of the kinds; a process that only validates a
    configuration naming these targets (every Spark worker does) loads no client."""
    loaded = fresh_interpreter(
        "import sys, tidings.targets.registry\n"
        "from tidings.config import load_config\n"
        "load_config({'targets': {'r': {'kind': 'redis_stream', 'stream': 's'},"
        " 'm': {'kind': 'mqtt', 'topic': 't'}}})\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'redis', 'paho'}))"
    )
    assert loaded == "[]"
