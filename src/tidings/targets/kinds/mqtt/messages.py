"""What the MQTT target puts on the wire: topics, user properties, sizes, and what a PUBACK's
reason code says.

A topic comes from a template; each placeholder's value must be one topic level (no ``/``,
no wildcard ``+`` or ``#``, no NUL, not empty): mapping such a value would silently send two
different values to one topic, and a ``/`` in a value would change the topic's depth.

With MQTT 5 an event's fields go as user properties, custom headers first, then tidings'
own (:data:`TIDINGS_PROPERTIES`); a custom header named like one of tidings' (in any letter
case) is dropped, so those always mean what the target says. With MQTT 3.1.1 there are no
properties: the headers travel in the payload's CloudEvents envelope only.
"""

from __future__ import annotations

import re

from tidings.events.outbox import OutboxEvent
from tidings.targets.destination import DestinationTemplate

#: User properties the target sets itself.
TIDINGS_PROPERTIES = (
    "Tidings-Event-Id",
    "Tidings-Event-Type",
    "Tidings-Event-Version",
    "Tidings-Seq",
    "Tidings-Logged-At",
    "Tidings-Correlation-Id",
    "Tidings-Originator",
    "Tidings-Partition-Key",
)
_RESERVED = frozenset(name.lower() for name in TIDINGS_PROPERTIES)
_NOT_IN_A_LEVEL = re.compile(r"[/+#\x00]")
#: What an MQTT string may not hold (Mosquitto closes the connection of a client that sends
#: one, in a topic or a user property): control characters and the non-characters U+FFFE,
#: U+FFFF.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ufffe\uffff]")
#: The largest packet MQTT can frame (a remaining length of 268,435,455 bytes and its header).
PROTOCOL_MAX_PACKET = 268_435_455 + 5
#: PUBACK reason codes (MQTT 5) that say the broker cannot take messages now, not that this
#: one is wrong: 0x97 quota exceeded.
SERVER_STATES = frozenset({0x97})


def level_problem(value: str) -> str | None:
    """Why a placeholder's value cannot be one topic level (None if it can)."""
    if not value:
        return "empty, and a topic level cannot be"
    if bad := sorted(set(_NOT_IN_A_LEVEL.findall(value))):
        return f"a topic level cannot hold {' '.join(repr(c) for c in bad)}"
    if _CONTROL.search(value):
        return "an MQTT topic cannot hold control characters"
    return None


def properties_problem(pairs: list[tuple[str, str]]) -> str | None:
    """Why a broker would refuse these user properties (None if it would not): a control
    character in a header's name or value, on which Mosquitto drops the connection."""
    for name, value in pairs:
        if _CONTROL.search(name) or _CONTROL.search(value):
            return (
                f"header {name!r} holds a control character, which an MQTT user property "
                "cannot hold (the broker would close the connection)"
            )
    return None


def topic_template(text: str) -> DestinationTemplate:
    """A ``topic`` template parsed, and its literal text checked (ValueError if bad)."""
    template = DestinationTemplate(text, level_problem)
    shape = template.literal_shape("x")
    if "+" in shape or "#" in shape or _CONTROL.search(shape):
        raise ValueError(
            f"{text!r}: a topic to publish to cannot hold the wildcards + or #, nor control "
            "characters"
        )
    if shape.startswith("$"):
        raise ValueError(f"{text!r}: topics starting with $ are the broker's own")
    if len(shape.encode()) > 65535:
        raise ValueError(f"{text!r}: a topic is at most 65535 bytes")
    return template


def user_properties(event: OutboxEvent) -> list[tuple[str, str]]:
    """``event``'s MQTT 5 user properties: custom headers, then tidings' own."""
    pairs = [(k, v) for k, v in event.headers.items() if k.strip().lower() not in _RESERVED]
    pairs += [
        ("Tidings-Event-Id", event.event_id),
        ("Tidings-Event-Type", event.event_type),
        ("Tidings-Event-Version", event.version),
        ("Tidings-Seq", str(event.seq)),
        ("Tidings-Logged-At", event.logged_at.isoformat()),
    ]
    if event.correlation_id is not None:
        pairs.append(("Tidings-Correlation-Id", event.correlation_id))
    if event.originator is not None:
        pairs.append(("Tidings-Originator", event.originator))
    if event.partition_key is not None:
        pairs.append(("Tidings-Partition-Key", event.partition_key))
    return pairs


def packet_size(topic: str, payload: bytes, properties: list[tuple[str, str]] | None) -> int:
    """Bytes of the PUBLISH packet (QoS 1): fixed header, topic, packet id, properties (MQTT
    5; None for 3.1.1), payload. What a broker's Maximum Packet Size counts."""
    body = 2 + len(topic.encode()) + 2 + len(payload)
    if properties is not None:
        props = sum(5 + len(k.encode()) + len(v.encode()) for k, v in properties)
        body += _varint_size(props) + props
    return 1 + _varint_size(body) + body


def _varint_size(value: int) -> int:
    size = 1
    while value >= 128:
        value >>= 7
        size += 1
    return size
