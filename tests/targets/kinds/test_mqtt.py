"""The MQTT target against real Mosquitto brokers.

Most tests use the shared broker on 127.0.0.1:1883, each on topics under a tag of its own
(retained messages are cleared afterwards). The ACL, size-limit, credentials, TLS and
stop-and-restart tests run a private ``mosquitto`` on a free port, so the shared broker is
never stopped or reconfigured.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from sqlalchemy import select

import tidings.targets.registry  # noqa: F401 - enters the target kinds into the config
from bench.harness.processes import free_port
from tests.support.brokers import Traffic, first_seen_order, mosquitto
from tests.support.certificates import TestCA
from tests.support.helpers import relay_config, statuses
from tidings.config import load_config
from tidings.db import make_engine
from tidings.errors import ConfigError, TargetError, TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.relay_query import start_relay
from tidings.targets.kinds.mqtt.config import MqttTargetConfig
from tidings.targets.kinds.mqtt.messages import packet_size, user_properties
from tidings.targets.kinds.mqtt.target import MqttTarget

pytestmark = pytest.mark.mqtt

LOGGED_AT = datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=UTC)


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


@dataclass
class Received:
    topic: str
    payload: str
    retain: bool
    properties: list[tuple[str, str]]

    def prop(self, name: str) -> str:
        return dict(self.properties)[name]


class Subscriber:
    """A real MQTT 5 subscriber at QoS 1; ``session`` keeps its session (and what the broker
    queued for it) across reconnects and broker restarts."""

    def __init__(self, port: int, topic: str, *, session: str | None = None) -> None:
        self.messages: list[Received] = []
        self._lock = threading.Condition()
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=session or f"sub-{uuid.uuid4().hex[:12]}",
            protocol=paho.MQTTv5,
        )
        self._subscribed = threading.Event()
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self.client.reconnect_delay_set(0.1, 0.5)
        props = None
        if session is not None:
            props = Properties(paho.PacketTypes.CONNECT)
            props.SessionExpiryInterval = 3600
        self.client.connect("127.0.0.1", port, clean_start=session is None, properties=props)
        self.client.loop_start()
        assert self._subscribed.wait(10)

    def _on_message(self, client: Any, userdata: Any, msg: paho.MQTTMessage) -> None:
        props = getattr(msg.properties, "UserProperty", []) if msg.properties else []
        with self._lock:
            self.messages.append(
                Received(msg.topic, msg.payload.decode(), bool(msg.retain), list(props))
            )
            self._lock.notify_all()

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.messages) < count and time.monotonic() < deadline:
                self._lock.wait(0.1)
            return list(self.messages)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


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
    built: list[MqttTarget] = []

    def make(**overrides: Any) -> MqttTarget:
        settings: dict[str, Any] = {
            "kind": "mqtt",
            "topic": f"{tag}/{{event_type}}",
            "timeout": "2s",
            **overrides,
        }
        target = MqttTarget("mq-test", MqttTargetConfig(**settings))
        built.append(target)
        return target

    yield make
    for target in built:
        target.close()


# -- messages, topics, properties -----------------------------------------------------------


def test_messages_arrive_with_topic_payload_and_user_properties(
    make_target: Callable[..., MqttTarget], tag: str
) -> None:
    sub = Subscriber(1883, f"{tag}/#")
    full = event(
        1,
        payload='{"id": 1, "name": "Grüße"}',
        version="2",
        correlation_id="corr-1",
        originator="shop",
        partition_key="order-1",
        headers={"tenant": "acme", "tidings-seq": "forged"},
    )
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


def test_a_header_with_a_control_character_fails_alone_and_is_refused_at_emit(
    make_target: Callable[..., MqttTarget], tag: str
) -> None:
    """Mosquitto closes the connection of a client that sends a control character in a user
    property; the target refuses that event instead, and its neighbours go."""
    sub = Subscriber(1883, f"{tag}/#")
    target = make_target()
    tabbed = event(2, headers={"note": "tab\there"})
    try:
        results = target.publish([event(1), tabbed, event(3)])
        got = sub.wait_for(2)
    finally:
        sub.close()

    assert results[0] is None and results[2] is None
    assert results[1] is not None
    assert "header 'note' holds a control character" in results[1]
    assert target.refusal(tabbed) == results[1]
    assert sorted(m.prop("Tidings-Seq") for m in got) == ["1", "3"]
    # Over MQTT 3.1.1 there are no properties: the header travels in the payload alone.
    assert make_target(protocol="3.1.1").publish([tabbed]) == [None]


def test_mqtt_3_1_1_publishes_without_properties(
    make_target: Callable[..., MqttTarget], tag: str
) -> None:
    sub = Subscriber(1883, f"{tag}/#")
    try:
        assert make_target(protocol="3.1.1").publish([event(1, headers={"a": "b"})]) == [None]
        (got,) = sub.wait_for(1)
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


def test_a_key_goes_in_call_order_across_rounds(
    make_target: Callable[..., MqttTarget], tag: str
) -> None:
    sub = Subscriber(1883, f"{tag}/#")
    run = [event(seq, partition_key=f"k{seq % 3}") for seq in range(1, 61)]
    try:
        assert make_target().publish(run) == [None] * 60
        got = sub.wait_for(60)
    finally:
        sub.close()
    order = first_seen_order([(m.prop("Tidings-Event-Id"), m.prop("Tidings-Partition-Key"),
                               int(m.prop("Tidings-Seq"))) for m in got])  # fmt: skip
    assert order == {f"k{k}": [s for s in range(1, 61) if s % 3 == k] for k in (1, 2, 0)}


def test_publishing_from_many_threads_at_once(
    make_target: Callable[..., MqttTarget], tag: str
) -> None:
    """Calls from several threads (Spark's tasks) share one connection, one at a time."""
    sub = Subscriber(1883, f"{tag}/#")
    target = make_target()
    results: list[list[str | None]] = []

    def publish(base: int) -> None:
        results.append(target.publish([event(base + i) for i in range(200)]))

    threads = [threading.Thread(target=publish, args=(n * 1000,)) for n in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        got = sub.wait_for(800)
    finally:
        sub.close()

    assert [r for batch in results for r in batch] == [None] * 800
    assert len({m.prop("Tidings-Event-Id") for m in got}) == 800


def test_an_event_whose_topic_cannot_be_filled_fails_alone_and_is_refused_at_emit(
    make_target: Callable[..., MqttTarget], tag: str
) -> None:
    target = make_target(topic=f"{tag}/{{headers.kind}}")
    good, missing, slashed = (
        event(1, headers={"kind": "a"}),
        event(2),
        event(3, headers={"kind": "a/b"}),
    )

    results = target.publish([good, missing, slashed])

    assert results[0] is None
    assert results[1] == (
        f"mqtt target 'mq-test': no topic for event {missing.event_id} (seq 2): placeholder "
        f"{{headers.kind}} of '{tag}/{{headers.kind}}': the event has no header 'kind'"
    )
    assert results[2] is not None and "a topic level cannot hold '/'" in results[2]
    assert target.refusal(missing) == results[1]
    assert target.refusal(good) is None


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


def test_a_message_over_the_limits_fails_alone_with_its_size(
    make_target: Callable[..., MqttTarget], tmp_path: Path
) -> None:
    """Mosquitto's ``max_packet_size`` is announced in its CONNACK (MQTT 5) and learnt on
    connecting; ``message_size_limit`` is not, so it is configured as max_message_bytes."""
    broker = mosquitto(tmp_path / "b", "allow_anonymous true\nmax_packet_size 4000")
    broker.start()
    try:
        target = make_target(port=broker.port, topic="sized/{event_type}", max_message_bytes=3000)
        packet_big = event(2, payload='"' + "x" * 2990 + '"', headers={"h": "v" * 1000})
        payload_big = event(3, payload='"' + "x" * 3000 + '"')
        size = packet_size("sized/order.created", packet_big.payload.encode(),
                           user_properties(packet_big))  # fmt: skip

        results = target.publish([event(1), packet_big, payload_big, event(4)])

        assert results[0] is None and results[3] is None
        assert results[1] is not None
        assert f"the packet would be {size} bytes (payload 2992)" in results[1]
        assert "maximum packet size of 4000 bytes" in results[1]
        assert results[2] == target.refusal(payload_big)
        assert "the payload is 3002 bytes, over max_message_bytes (3000)" in results[2]
        assert target.refusal(packet_big) == results[1]  # learnt on connecting
    finally:
        broker.kill()


# -- outages ----------------------------------------------------------------------------------


def test_an_unreachable_broker_is_unavailable(make_target: Callable[..., MqttTarget]) -> None:
    target = make_target(port=free_port())

    with pytest.raises(TargetUnavailable) as raised:
        target.publish([event(1)])

    assert "'mq-test'" in str(raised.value) and "cannot connect" in str(raised.value)
    assert target.publish([]) == []


@pytest.mark.slow
def test_the_broker_stopped_and_restarted_under_traffic_loses_nothing_and_keeps_order(
    make_target: Callable[..., MqttTarget], tmp_path: Path
) -> None:
    """A private broker with persistence is stopped twice while events of 20 keys are being
    published as the relay would (what failed is sent again), and started again; a
    subscriber with a persistent session at QoS 1 gets every event, and dropping event ids
    it has seen, each key's events in log order.

    It is stopped with SIGTERM, not SIGKILL: Mosquitto writes its persistence file on
    shutdown and at intervals only, so a SIGKILLed Mosquitto loses what it acknowledged
    since it last wrote it, and no client can prevent that."""
    store = tmp_path / "b"
    broker = mosquitto(
        store, f"allow_anonymous true\npersistence true\npersistence_location {store}/"
    )
    broker.start()
    sub = Subscriber(broker.port, "traffic/#", session=f"sub-{uuid.uuid4().hex[:8]}")
    target = make_target(port=broker.port, topic="traffic/{partition_key}", timeout="1s")
    events = [event(seq, partition_key=f"k{seq % 20}") for seq in range(1, 2001)]
    traffic = Traffic(target, events)
    try:
        traffic.start()
        for share in (0.3, 0.6):  # stopped while events are still flowing
            traffic.wait_until(share)
            broker.kill(signal.SIGTERM)
            time.sleep(0.5)
            broker.start()
        traffic.join(180)
        assert traffic.error is None and traffic.failed_calls >= 1  # the stops were felt
        ids = {e.event_id for e in events}
        deadline = time.monotonic() + 30
        while {m.prop("Tidings-Event-Id") for m in sub.messages} != ids:
            assert time.monotonic() < deadline, "the subscriber did not get every event"
            time.sleep(0.1)
    finally:
        sub.close()
        broker.kill()
    got = [(m.prop("Tidings-Event-Id"), m.prop("Tidings-Partition-Key"), int(m.prop("Tidings-Seq")))
           for m in sub.messages]  # fmt: skip
    order = first_seen_order(got)
    assert all(seqs == sorted(seqs) and len(seqs) == 100 for seqs in order.values())


# -- configuration, credentials, TLS ---------------------------------------------------------


def mqtt_config(**entry: Any) -> Any:
    target = {"kind": "mqtt", "topic": "t/{event_type}", **entry}
    return load_config({"targets": {"mq": target}}).targets["mq"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"topic": "t/{aggregate}"}, "unknown placeholder {aggregate}"),
        ({"topic": "t/+/{event_type}"}, "cannot hold the wildcards + or #"),
        ({"topic": "t/#"}, "cannot hold the wildcards + or #"),
        ({"topic": "t/\x01/{event_type}"}, "nor control characters"),
        ({"topic": "$SYS/{event_type}"}, "topics starting with $ are the broker's own"),
        ({"protocol": "4"}, "protocol"),
        ({"port": 0}, "port"),
        ({"client_id": "x" * 24}, "client_id"),
        ({"password_env": "NOT-A-NAME"}, "password_env"),
        ({"max_message_bytes": 0}, "max_message_bytes"),
        ({"tls": {"verify": True, "server_name": "broker"}}, "tls.server_name is not supported"),
    ],
)
def test_a_bad_configuration_is_a_config_error_naming_it(
    entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        mqtt_config(**entry)

    assert "targets.mq" in str(raised.value) and message in str(raised.value)


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


def test_close_is_final(make_target: Callable[..., MqttTarget]) -> None:
    target = make_target()
    assert target.publish([event(1)]) == [None]
    target.close()
    with pytest.raises(TargetError, match="closed"):
        target.publish([event(2)])


@pytest.mark.spark
def test_the_relay_delivers_from_configuration_and_fails_only_the_event_without_a_topic(
    spark: Any, tag: str, tmp_path: Path
) -> None:
    target = {"kind": "mqtt", "topic": f"{tag}/{{payload.data.region}}", "timeout": "2s"}
    config = relay_config(
        tmp_path, targets={"mq": target}, routes={"Created": ["mq"]}, retry={"backoff": ["1ms"]}
    )
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)  # no routed targets: the relay meets the bad event
    for n, region in enumerate(["eu", None, "eu", "us"]):
        with outbox.transaction() as tx:
            tx.emit("Created", {"n": n, "region": region}, partition_key=f"k{n}")
    sub = Subscriber(1883, f"{tag}/#")
    try:
        start_relay(spark, config, available_now=True).awaitTermination()
        got = sub.wait_for(3)
    finally:
        sub.close()

    assert statuses(engine) == {1: "PUBLISHED", 2: "FAILED", 3: "PUBLISHED", 4: "PUBLISHED"}
    with engine.connect() as conn:
        error = conn.execute(
            select(outbox_event.c.error_details).where(outbox_event.c.seq == 2)
        ).scalar_one()
    assert "no topic for event" in error and "placeholder {payload.data.region}" in error
    assert sorted((m.topic, m.prop("Tidings-Seq")) for m in got) == [
        (f"{tag}/eu", "1"),
        (f"{tag}/eu", "3"),
        (f"{tag}/us", "4"),
    ]
