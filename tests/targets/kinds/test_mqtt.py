"""The MQTT target against real Mosquitto brokers: what only this kind does (user
properties, MQTT 3.1.1, retained messages, the broker's ACL refusals, max_message_bytes,
passwords, TLS). The contract every kind keeps is checked in
``tests/targets/contract/``.

Most tests use the shared broker on 127.0.0.1:1883, each on topics under a tag of its own
(retained messages are cleared afterwards). The ACL, credentials and TLS tests run a
private ``mosquitto`` on a free port, so the shared broker is never reconfigured.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import tidings.targets.registry  # noqa: F401 - enters the target kinds into the config
from tests.support.brokers import mosquitto
from tests.support.certificates import TestCA
from tests.targets.kinds.mqtt_support import Subscriber
from tests.targets.makers import target_maker
from tests.targets.outbox_events import event, full_event
from tidings.errors import TargetUnavailable
from tidings.targets.kinds.mqtt.config import MqttTargetConfig
from tidings.targets.kinds.mqtt.target import MqttTarget

pytestmark = pytest.mark.mqtt


@pytest.fixture
def tag() -> Iterator[str]:
    """A topic prefix no other test uses; retained messages under it are cleared after."""
    tag = f"tidings-test/{uuid.uuid4().hex[:12]}"
    yield tag
    clear = Subscriber(1883, f"{tag}/#")
    retained = [m.topic for m in clear.wait_for(10_000, timeout=0.5) if m.retain]
    for topic in retained:
        clear.client.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)
    clear.close()


@pytest.fixture
def make_target(tag: str) -> Iterator[Callable[..., MqttTarget]]:
    yield from target_maker(
        lambda entry: MqttTarget("mq-test", MqttTargetConfig(**entry)),
        {"kind": "mqtt", "topic": f"{tag}/{{event_type}}", "timeout": "2s"},
    )


# -- messages, topics, properties -----------------------------------------------------------


def test_messages_arrive_with_topic_payload_and_user_properties(
    make_target: Callable[..., MqttTarget], tag: str
) -> None:
    sub = Subscriber(1883, f"{tag}/#")
    full = full_event(1, {"tenant": "acme", "tidings-seq": "forged"})
    bare = event(2, event_type="OrderShipped")
    try:
        assert make_target().publish([full, bare]) == [None, None]
        first, second = sub.wait_for(2)
    finally:
        sub.close()

    assert first.topic == f"{tag}/order.created" and not first.retain
    assert first.payload == '{"id": 1, "name": "Grüße"}'
    assert first.properties == [
        ("tenant", "acme"),
        ("Tidings-Event-Id", full.event_id),
        ("Tidings-Event-Type", "order.created"),
        ("Tidings-Event-Version", "2"),
        ("Tidings-Seq", "1"),
        ("Tidings-Logged-At", "2024-05-17T09:30:15.123456+00:00"),
        ("Tidings-Correlation-Id", "corr-1"),
        ("Tidings-Originator", "shop"),
        ("Tidings-Partition-Key", "order-1"),
    ]
    assert (
        second.topic == f"{tag}/OrderShipped" and second.prop("Tidings-Event-Id") == bare.event_id
    )


def test_mqtt_3_1_1_publishes_without_properties(
    make_target: Callable[..., MqttTarget], tag: str
) -> None:
    sub = Subscriber(1883, f"{tag}/#")
    try:
        assert make_target(protocol="3.1.1").publish([event(1, headers={"a": "b"})]) == [None]
        (got,) = sub.wait_for(1)
        # No properties over MQTT 3.1.1: a header MQTT 5 refuses (a control character in a
        # user property) travels in the payload's envelope alone, so the event goes.
        assert make_target(protocol="3.1.1").publish([event(2, headers={"n": "t\tb"})]) == [None]
    finally:
        sub.close()
    assert got.payload == '{"n": 1}' and got.properties == []


def test_retained_messages_hold_the_latest_state_per_key(
    make_target: Callable[..., MqttTarget], tag: str
) -> None:
    target = make_target(topic=f"{tag}/state/{{partition_key}}", retain=True)
    calls = [
        [event(1, partition_key="a"), event(2, partition_key="b")],
        [event(3, partition_key="a")],
    ]
    for call in calls:
        assert target.publish(call) == [None] * len(call)

    late = Subscriber(1883, f"{tag}/state/+")  # subscribes after every publish
    try:
        got = late.wait_for(2)
    finally:
        late.close()

    assert all(m.retain for m in got)
    assert {m.topic: m.payload for m in got} == {
        f"{tag}/state/a": '{"n": 3}',
        f"{tag}/state/b": '{"n": 2}',
    }


# -- refusals by the broker, sizes ------------------------------------------------------------


def test_a_topic_the_acl_denies_is_refused_alone_and_stops_only_its_key(
    make_target: Callable[..., MqttTarget], tmp_path: Path
) -> None:
    """Mosquitto answers a PUBLISH its ACL denies with PUBACK 0x87 (MQTT 5): that event
    fails with the broker's reason, its key's later events are not sent, others go."""
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite open/#\n")
    broker = mosquitto(tmp_path / "b", f"allow_anonymous true\nacl_file {acl}")
    broker.start()
    try:
        target = make_target(port=broker.port, topic="{headers.area}/x")
        denied = event(2, partition_key="k1", headers={"area": "closed"})
        after = event(3, partition_key="k1", headers={"area": "open"})
        other = event(4, partition_key="k2", headers={"area": "open"})

        results = target.publish([event(1, partition_key="k1", headers={"area": "open"}),
                                  denied, other, after])  # fmt: skip

        assert results[0] is None and results[2] is None
        assert results[1] is not None and "the broker refused it: Not authorized" in results[1]
        assert results[3] is not None and "not sent: event seq 2 of its key failed" in results[3]
        assert target.publish([event(5, headers={"area": "open"})]) == [None]  # still connected
    finally:
        broker.kill()


def test_a_payload_over_max_message_bytes_fails_alone_and_is_refused_at_emit(
    make_target: Callable[..., MqttTarget],
) -> None:
    """Mosquitto's ``message_size_limit`` is not announced to clients (its
    ``max_packet_size`` is, in the CONNACK: the contract suite's size check), so it is
    configured as max_message_bytes and known before any connection."""
    target = make_target(max_message_bytes=3000)
    payload_big = event(2, payload='"' + "x" * 3000 + '"')
    reason = target.refusal(payload_big)

    results = target.publish([event(1), payload_big, event(3)])

    assert results == [None, reason, None]
    assert reason is not None
    assert "the payload is 3002 bytes, over max_message_bytes (3000)" in reason


# -- credentials, TLS ---------------------------------------------------------------------------


def test_a_user_with_its_password_from_the_environment(
    make_target: Callable[..., MqttTarget], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passwords = tmp_path / "passwords"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwords), "relay", "s3cret"], check=True)
    broker = mosquitto(tmp_path / "b", f"allow_anonymous false\npassword_file {passwords}")
    broker.start()
    try:
        monkeypatch.setenv("TIDINGS_TEST_MQTT_PASSWORD", "s3cret")
        secured = {
            "port": broker.port,
            "username": "relay",
            "password_env": "TIDINGS_TEST_MQTT_PASSWORD",
        }
        assert make_target(**secured).publish([event(1)]) == [None]
        with pytest.raises(TargetUnavailable, match="refused the connection: Not authorized"):
            make_target(port=broker.port).publish([event(2)])
        monkeypatch.setenv("TIDINGS_TEST_MQTT_PASSWORD", "wrong")
        with pytest.raises(TargetUnavailable, match="refused the connection"):
            make_target(**secured).publish([event(3)])
        monkeypatch.delenv("TIDINGS_TEST_MQTT_PASSWORD")
        with pytest.raises(TargetUnavailable, match="'TIDINGS_TEST_MQTT_PASSWORD' is not set"):
            make_target(**secured).publish([event(4)])
    finally:
        broker.kill()


def test_tls_with_a_client_certificate(
    make_target: Callable[..., MqttTarget], tmp_path: Path
) -> None:
    ca = TestCA(tmp_path / "pki")
    served, client = ca.server(), ca.client("relay")
    broker = mosquitto(
        tmp_path / "b",
        f"allow_anonymous true\ncafile {ca.cert}\ncertfile {served.cert}\nkeyfile {served.key}\n"
        "require_certificate true",
    )
    broker.start()
    tls = {"ca_file": str(ca.cert), "cert_file": str(client.cert), "key_file": str(client.key)}
    try:
        assert make_target(port=broker.port, tls=tls).publish([event(1)]) == [None]
        with pytest.raises(TargetUnavailable, match="mq-test"):
            make_target(port=broker.port, tls={"ca_file": str(ca.cert)}).publish([event(2)])
        with pytest.raises(TargetUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            make_target(port=broker.port, tls={}).publish([event(3)])  # the system CAs
    finally:
        broker.kill()
