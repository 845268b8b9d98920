"""The mqtt kind in the contract suite: topics under a tag of the test's on the shared
Mosquitto (127.0.0.1:1883), read by a QoS 1 subscriber started before anything is sent;
the size limit on a private ``mosquitto`` whose ``max_packet_size`` is 4000 bytes."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bench.harness.processes import free_port
from tests.support.brokers import mosquitto
from tests.targets.contract.harness import Delivered, KindHarness, Outage, Sized, payload_n
from tests.targets.kinds.mqtt_support import Received, Subscriber
from tests.targets.outbox_events import event
from tidings.events.outbox import OutboxEvent
from tidings.targets.kinds.mqtt.messages import packet_size, user_properties

#: The user properties the target sets itself; the others are the event's headers.
OWN = {"Tidings-Event-Id", "Tidings-Event-Type", "Tidings-Event-Version", "Tidings-Seq",
       "Tidings-Logged-At", "Tidings-Correlation-Id", "Tidings-Originator",
       "Tidings-Partition-Key"}  # fmt: skip


def as_delivered(message: Received) -> Delivered:
    props = dict(message.properties)
    return Delivered(
        props["Tidings-Event-Id"],
        props.get("Tidings-Partition-Key"),
        payload_n(message.payload),
        message.topic,
        {k: v for k, v in message.properties if k not in OWN},
    )


class MqttHarness(KindHarness):
    kind = "mqtt"
    marks = (pytest.mark.mqtt,)
    template_key = "topic"
    destination_word = "topic"
    bad_value = ("a/b", "a topic level cannot hold '/'")
    minimal_entry: ClassVar[dict[str, Any]] = {"topic": "t/{event_type}"}
    bad_entries: ClassVar[list[tuple[dict[str, Any], str]]] = [
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
    ]
    poison_refused_at_emit = True
    restartable = True

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request, tmp_path)
        self.tag = f"tidings-test/{uuid.uuid4().hex[:12]}"
        self.subscriber = Subscriber(1883, f"{self.tag}/#")

    def settings(self) -> dict[str, Any]:
        return {"topic": f"{self.tag}/{{event_type}}", "timeout": "2s"}

    def template(self, *placeholders: str) -> str:
        return "/".join([self.tag, *placeholders])

    def destination(self, *values: str) -> str:
        return "/".join([self.tag, *values])

    def unreachable(self) -> dict[str, Any]:
        return {"port": free_port()}

    def poison(self, seq: int, key: str) -> tuple[OutboxEvent, str]:
        """A header with a control character: Mosquitto would close the connection of a
        client sending it in a user property, so the target refuses that event."""
        tabbed = event(seq, partition_key=key, headers={"note": "tab\there"})
        return tabbed, "header 'note' holds a control character"

    @contextmanager
    def sized(self) -> Iterator[Sized]:
        """``max_packet_size`` is announced in Mosquitto's CONNACK (MQTT 5)."""
        broker = mosquitto(self.tmp_path / "small", "allow_anonymous true\nmax_packet_size 4000")
        broker.start()
        try:
            big = event(2, payload='"' + "x" * 2990 + '"', headers={"h": "v" * 1000})
            size = packet_size("sized/order.created", big.payload.encode(), user_properties(big))
            target = self.make(port=broker.port, topic="sized/{event_type}")
            reasons = [
                f"the packet would be {size} bytes (payload 2992)",
                "maximum packet size of 4000 bytes",
            ]
            yield Sized(target, big, reasons, known_before_publish=False)
        finally:
            broker.kill()

    @contextmanager
    def outage(self) -> Iterator[Outage]:
        """A private broker with persistence, read by a subscriber with a persistent
        session at QoS 1. It is stopped with SIGTERM, not SIGKILL: Mosquitto writes its
        persistence file on shutdown and at intervals only, so a SIGKILLed Mosquitto loses
        what it acknowledged since it last wrote it, and no client can prevent that."""
        store = self.tmp_path / "b"
        broker = mosquitto(
            store, f"allow_anonymous true\npersistence true\npersistence_location {store}/"
        )
        broker.start()
        sub = Subscriber(broker.port, "traffic/#", session=f"sub-{uuid.uuid4().hex[:8]}")

        def restart() -> None:
            broker.kill(signal.SIGTERM)
            time.sleep(0.5)
            broker.start()

        def delivered(ids: set[str]) -> list[Delivered]:
            deadline = time.monotonic() + 30
            while {m.prop("Tidings-Event-Id") for m in sub.messages} != ids:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            return [as_delivered(m) for m in sub.messages]

        target = self.make(port=broker.port, topic="traffic/{partition_key}", timeout="1s")
        try:
            yield Outage(target, 2000, restart, delivered)
        finally:
            sub.close()
            broker.kill()

    def delivered(self, expect: int) -> list[Delivered]:
        return [as_delivered(m) for m in self.subscriber.wait_for(expect)]

    def close(self) -> None:
        super().close()
        self.subscriber.close()
