"""A real MQTT 5 subscriber for the mqtt target's tests and the contract suite: what a
broker delivered, read back with its topic, payload, retain flag and user properties."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties


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
