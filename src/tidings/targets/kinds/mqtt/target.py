"""The MQTT target: a QoS 1 PUBLISH per event through paho-mqtt, confirmed by its PUBACK.

The relay calls :meth:`MqttTarget.publish` from Spark executor threads; they share one
connection (:class:`~tidings.targets.kinds.mqtt.link.Link`), whose network thread is
paho's. A call goes in rounds (:mod:`tidings.targets.rounds`): each round publishes the
next event of every ordering key and waits for all their PUBACKs, so a key's events reach
the broker in call order and none is sent after one that was refused.

Delivery is at-least-once: a message the broker took but whose PUBACK was lost (the
connection broke) is published again when the relay retries, and subscribers see it twice
with the same ``Tidings-Event-Id`` user property (MQTT 5), by which they drop it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidings.errors import TargetCallFailed, TargetError, TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.targets.base import Target
from tidings.targets.destination import RenderError
from tidings.targets.kinds.mqtt.config import MqttTargetConfig
from tidings.targets.kinds.mqtt.messages import (
    PROTOCOL_MAX_PACKET,
    SERVER_STATES,
    packet_size,
    properties_problem,
    topic_template,
    user_properties,
)
from tidings.targets.rounds import Rounds

if TYPE_CHECKING:  # paho-mqtt is imported where a connection is made: a process that only
    # validates configurations (every Spark worker does) does not load it.
    from tidings.targets.kinds.mqtt.link import Link

_log = logging.getLogger("tidings.targets.kinds.mqtt")


class MqttTarget(Target):
    """Publishes events to an MQTT broker at QoS 1; connects lazily, reconnects after
    failures."""

    atomic = False
    #: A key's events go one round (one PUBACK round trip) after another: a run is bounded
    #: to keep one call within seconds.
    events_per_key = 100
    config_model = MqttTargetConfig

    def __init__(self, name: str, config: MqttTargetConfig) -> None:
        super().__init__(name)
        self.config = config
        self._template = topic_template(config.topic)
        self._timeout = config.timeout.total_seconds()
        self._lock = threading.Lock()  # one call at a time on the link: rounds wait for it
        self._link: Link | None = None
        self._max_packet: int | None = None  # the broker's, once a link said
        self._closed = False

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """Publish every event at QoS 1; None per event the broker acknowledged, else why."""
        if self._closed:
            raise TargetError(f"mqtt target {self.name!r} is closed")
        if not events:
            return []
        with self._lock:
            try:
                link = self._connection()
            except TargetError as exc:
                raise TargetUnavailable(f"mqtt target {self.name!r}: {exc}") from None
            rounds = Rounds(events)
            while sent := rounds.next_round():
                if link.lost:  # lost after the last round's PUBACKs all came
                    link = self._reconnect(rounds, link)
                self._round(link, rounds, sent)
            return rounds.results

    def refusal(self, event: OutboxEvent) -> str | None:
        """The event has no topic (its template cannot be filled from it), or it is larger
        than the broker takes (``max_message_bytes``; the broker's Maximum Packet Size once
        a connection learnt it)."""
        try:
            topic = self._template.render(event)
        except RenderError as exc:
            return self._no_topic(event, exc)
        return self._oversize(event, topic, self._max_packet or PROTOCOL_MAX_PACKET)

    def close(self) -> None:
        """Disconnect and stop paho's network thread; the target is not used afterwards."""
        self._closed = True
        with self._lock:
            if self._link is not None:
                self._link.close()
                self._link = None

    # -- one round -----------------------------------------------------------------------

    def _round(self, link: Link, rounds: Rounds, sent: list[int]) -> None:
        """Publish the events ``sent`` (one per key), at most the broker's Receive Maximum
        awaiting their PUBACK at once, and settle the PUBACKs."""
        ready: list[tuple[int, str]] = []
        for index in sent:
            event = rounds.events[index]
            try:
                topic = self._template.render(event)
            except RenderError as exc:
                rounds.fail(index, self._no_topic(event, exc))
                continue
            if (problem := self._oversize(event, topic, link.max_packet)) is not None:
                rounds.fail(index, problem)
                continue
            ready.append((index, topic))
        for start in range(0, len(ready), link.receive_max):
            self._window(link, rounds, ready[start : start + link.receive_max])

    def _window(self, link: Link, rounds: Rounds, ready: list[tuple[int, str]]) -> None:
        waiting: dict[int, tuple[int, str]] = {}  # packet id -> (index, topic)
        unsent = False
        for index, topic in ready:
            event = rounds.events[index]
            properties = user_properties(event) if link.v5 else None
            mid = link.publish(topic, event.payload.encode(), properties)
            if isinstance(mid, str):
                if link.lost:
                    unsent = True
                    break
                rounds.fail(index, self._error(topic, mid))
                continue
            waiting[mid] = (index, topic)
        acks = link.wait(set(waiting), self._timeout) if waiting else {}
        busy: str | None = None
        for mid, (index, topic) in waiting.items():
            if mid not in acks:
                continue
            code, reason = acks[mid]
            if code < 0x80:  # success, or "no matching subscribers"
                rounds.confirm(index)
            else:
                rounds.fail(index, self._error(topic, f"the broker refused it: {reason}"))
                if code in SERVER_STATES:
                    busy = reason
        if unsent or len(acks) < len(waiting):
            self._drop()
            self._unanswered(rounds, link, len(waiting) - len(acks))
        if busy is not None:
            message = f"mqtt target {self.name!r}: the broker refuses messages: {busy}"
            if not any(rounds.confirmed):
                raise TargetUnavailable(message)
            raise TargetCallFailed(message, confirmed=rounds.confirmed)

    def _reconnect(self, rounds: Rounds, link: Link) -> Link:
        """A new link for the call's next round, the last one lost after all its PUBACKs
        came: what was confirmed stays confirmed if the broker cannot be reached now."""
        try:
            return self._connection()
        except TargetError as exc:
            message = f"mqtt target {self.name!r}: {link.lost_because} and {exc}"
            if not any(rounds.confirmed):
                raise TargetUnavailable(message) from None
            raise TargetCallFailed(message, confirmed=rounds.confirmed) from None

    def _unanswered(self, rounds: Rounds, link: Link, missing: int) -> None:
        """PUBACKs are missing: the link was lost or the broker fell silent. Whether those
        messages arrived is not known. A broker that cannot be reached again, or that
        acknowledged nothing of the call, is down (no event is blamed); otherwise the call
        fails as a whole with what was confirmed and the relay narrows it down."""
        cause = link.lost_because or f"{missing} PUBACKs missing after {self._timeout:g}s"
        try:
            self._connection()
        except TargetError as exc:
            raise TargetUnavailable(
                f"mqtt target {self.name!r}: the broker went away during the call ({cause}) "
                f"and {exc}"
            ) from None
        if not any(rounds.confirmed):
            raise TargetUnavailable(f"mqtt target {self.name!r}: {cause}")
        raise TargetCallFailed(
            f"mqtt target {self.name!r}: {cause} during the call", confirmed=rounds.confirmed
        )

    def _oversize(self, event: OutboxEvent, topic: str, max_packet: int) -> str | None:
        payload = event.payload.encode()
        limit = self.config.max_message_bytes
        if limit is not None and len(payload) > limit:
            return self._error(
                topic,
                f"the payload is {len(payload)} bytes, over max_message_bytes ({limit})",
            )
        properties = user_properties(event) if self.config.protocol == "5" else None
        if properties is not None and (problem := properties_problem(properties)) is not None:
            return self._error(topic, problem)
        size = packet_size(topic, payload, properties)
        if size > max_packet:
            return self._error(
                topic,
                f"the packet would be {size} bytes (payload {len(payload)}), over the "
                f"broker's maximum packet size of {max_packet} bytes",
            )
        return None

    def _error(self, topic: str, cause: str) -> str:
        return f"mqtt target {self.name!r}: publish to {topic!r} failed: {cause}"

    def _no_topic(self, event: OutboxEvent, exc: RenderError) -> str:
        return (
            f"mqtt target {self.name!r}: no topic for event {event.event_id} "
            f"(seq {event.seq}): {exc}"
        )

    # -- connection ----------------------------------------------------------------------

    def _connection(self) -> Link:
        """The live link, opening a new one if there is none (the caller holds the lock)."""
        if self._link is None or self._link.lost:
            self._drop()
            from tidings.targets.kinds.mqtt.link import Link

            link = Link(self.name, self.config)
            link.connect()
            self._link = link
            self._max_packet = link.max_packet
        return self._link

    def _drop(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
