"""One connection of the MQTT target to its broker, and the PUBACKs it waits for.

paho-mqtt runs the connection in a network thread of its own (``loop_start``) and reports
each PUBACK to a callback there; callers in other threads publish and then wait on a
condition until their packet ids are acknowledged, the connection is lost, or the time is
up. paho's own reconnection is off: it would send queued messages again after this target
had reported them failed; a lost link is dropped and the next call opens a new one.

paho-mqtt itself is imported where it is used: the target registry imports every module
of the kinds, and a process that only validates configurations (every Spark worker does)
must not load it.
"""

from __future__ import annotations

import contextlib
import secrets
import string
import threading
import time
from typing import TYPE_CHECKING, Any

from tidings.errors import TargetError, TlsError
from tidings.targets.kinds.mqtt.config import MqttTargetConfig
from tidings.targets.kinds.mqtt.messages import PROTOCOL_MAX_PACKET
from tidings.targets.secrets import secret_from_env

if TYPE_CHECKING:
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

#: PUBACK arrived: the reason code (0 success, 0x10 no subscribers) and its name.
Ack = tuple[int, str]
#: The most PUBLISHes in flight without a bound from the broker (MQTT 3.1.1, or an MQTT 5
#: broker that announces none). paho is told no lower bound: the target keeps this one.
_OUR_INFLIGHT = 1000


class Link:
    """A connected paho client; :meth:`publish` sends, :meth:`wait` collects PUBACKs."""

    def __init__(self, name: str, config: MqttTargetConfig) -> None:
        self.config = config
        self.v5 = config.protocol == "5"
        self.max_packet = PROTOCOL_MAX_PACKET  # the broker's, once it said (MQTT 5)
        #: How many PUBLISHes may await their PUBACK at once: the broker's Receive Maximum
        #: (MQTT 5; more would make it drop the connection), else a bound of our own.
        self.receive_max = _OUR_INFLIGHT
        self.lost_because: str | None = None
        self._cond = threading.Condition()
        self._acks: dict[int, Ack] = {}
        self._connack: ReasonCode | None = None
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        client_id = config.client_id or "tidings-" + "".join(
            secrets.choice(string.ascii_lowercase + string.digits) for _ in range(15)
        )
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=paho.MQTTv5 if self.v5 else paho.MQTTv311,
            reconnect_on_failure=False,
        )
        self.client.max_inflight_messages_set(65535)  # bounded by the target instead
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self._name = name

    @property
    def lost(self) -> bool:
        return self.lost_because is not None

    def connect(self) -> None:
        """Connect and wait for the broker's CONNACK; a TargetError says why not."""
        config = self.config
        timeout = config.timeout.total_seconds()
        password = secret_from_env("password_env", config.password_env)
        if config.username is not None:
            self.client.username_pw_set(config.username, password)
        if config.tls is not None:
            try:
                context = config.tls.context()
            except TlsError as exc:
                raise TargetError(f"cannot load the TLS files: {exc}") from None
            self.client.tls_set_context(context)
        self.client.connect_timeout = timeout
        where = f"{config.host}:{config.port}"
        try:
            if self.v5:
                self.client.connect(config.host, config.port, keepalive=60, clean_start=True)
            else:
                self.client.connect(config.host, config.port, keepalive=60)
        except Exception as exc:
            raise TargetError(f"cannot connect to {where}: {describe(exc)}") from None
        self.client.loop_start()
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._connack is None and not self.lost:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        if self._connack is None or self._connack.is_failure:
            self.close()
            why = (
                f"the broker refused the connection: {self._connack}"
                if self._connack is not None
                else self.lost_because or f"no CONNACK within {timeout:g}s"
            )
            raise TargetError(f"cannot connect to {where}: {why}")

    def publish(
        self, topic: str, payload: bytes, properties: list[tuple[str, str]] | None
    ) -> int | str:
        """Send one QoS 1 PUBLISH; its packet id, or why it could not be sent."""
        import paho.mqtt.client as paho
        from paho.mqtt.enums import MQTTErrorCode
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props: Properties | None = None
        if properties is not None:
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.UserProperty = properties
        try:
            info = self.client.publish(
                topic, payload, qos=1, retain=self.config.retain, properties=props
            )
        except Exception as exc:  # paho raises ValueError for what it cannot frame
            return describe(exc)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            return paho.error_string(info.rc)
        return info.mid

    def wait(self, mids: set[int], timeout: float) -> dict[int, Ack]:
        """The PUBACKs of ``mids`` that arrived until all did, the link was lost, or
        ``timeout`` seconds passed. A link that let the time pass must be closed: a PUBACK
        arriving later would be taken for that of a later message with the same id."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not mids <= self._acks.keys() and not self.lost:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return {mid: self._acks.pop(mid) for mid in mids if mid in self._acks}

    def close(self) -> None:
        """Disconnect (what was sent is sent) and stop the network thread; never raises."""
        with contextlib.suppress(Exception):
            self.client.disconnect()
        self.client.loop_stop()

    # -- paho's callbacks, in its network thread -------------------------------------------

    def _on_connect(
        self, client: Any, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        if self.v5 and properties is not None:
            inflight = getattr(properties, "ReceiveMaximum", None)
            if inflight:
                self.receive_max = int(inflight)
            size = getattr(properties, "MaximumPacketSize", None)
            if size:
                self.max_packet = int(size)
        with self._cond:
            self._connack = reason
            self._cond.notify_all()

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        with self._cond:
            self.lost_because = f"connection lost ({reason})"
            self._cond.notify_all()

    def _on_publish(
        self, client: Any, userdata: Any, mid: int, reason: ReasonCode, properties: Any
    ) -> None:
        with self._cond:
            self._acks[mid] = (reason.value, str(reason))
            self._cond.notify_all()


def describe(exc: BaseException) -> str:
    """Name the exception type too: some errors have empty or generic texts."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
