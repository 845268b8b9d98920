"""The Redis Streams target against real redis-server processes: what only this kind does
(its entries' fields, MAXLEN, a restart between calls, ACL users, TLS). The contract every
kind keeps (confirmation, templates, refusals, order, sizes, outages, configuration errors)
is checked in ``tests/targets/contract/``.

Most tests use the shared server on 127.0.0.1:6379, each on streams named with a tag of its
own, deleted afterwards. The restart, ACL and TLS tests run a private
``redis-server`` on a free port, so the shared server is never stopped or reconfigured.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

import tidings.targets.registry  # noqa: F401 - enters the target kinds into the config
from tests.support.brokers import redis_server
from tests.support.certificates import TestCA
from tests.support.helpers import fresh_interpreter
from tests.targets.makers import target_maker
from tests.targets.outbox_events import event, full_event
from tidings.errors import TargetUnavailable
from tidings.targets.kinds.redis_stream.config import RedisStreamTargetConfig
from tidings.targets.kinds.redis_stream.target import RedisStreamTarget

pytestmark = pytest.mark.redis

SHARED = "redis://127.0.0.1:6379/0"


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
    yield from target_maker(
        lambda entry: RedisStreamTarget("rs-test", RedisStreamTargetConfig(**entry)),
        {"kind": "redis_stream", "url": SHARED, "stream": f"{tag}:{{event_type}}", "timeout": "2s"},
    )


def entries(stream: str, url: str = SHARED) -> list[dict[str, str]]:
    """Every entry of ``stream``, its fields decoded, in stream order."""
    client = redis.Redis.from_url(url)
    try:
        found = client.xrange(stream)
    finally:
        client.close()
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in found]


# -- entries, MAXLEN ---------------------------------------------------------------------


def test_entries_hold_the_event_id_fields_headers_and_payload(
    make_target: Callable[..., RedisStreamTarget], tag: str
) -> None:
    full = full_event(1, {"tenant": "acme", "payload": "not the payload"})
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


def test_maxlen_trims_each_stream(make_target: Callable[..., RedisStreamTarget], tag: str) -> None:
    target = make_target(maxlen=5, maxlen_approximate=False)

    assert target.publish([event(s) for s in range(1, 13)]) == [None] * 12

    assert [int(e["seq"]) for e in entries(f"{tag}:order.created")] == [8, 9, 10, 11, 12]


# -- outages ----------------------------------------------------------------------------------


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


# -- credentials, TLS ------------------------------------------------------------------------------


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
