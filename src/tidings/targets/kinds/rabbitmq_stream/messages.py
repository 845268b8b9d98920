"""What the ``rabbitmq_stream`` target puts in a stream: AMQP 1.0 messages, and their sizes.

A message is the event's payload as its body (AMQP 1.0 ``data``), with these properties:
``message_id`` the event id, ``correlation_id`` the event's, ``content_type``
``application/json``, ``creation_time`` its logged-at (milliseconds); its application
properties are the same headers the ``rabbitmq`` target sends (the custom headers, then
``Tidings-Event-Type``, ``Tidings-Seq``...:
:func:`~tidings.targets.kinds.rabbitmq.messages.message_headers`), so a consumer reads
either kind alike, and RabbitMQ's AMQP 0-9-1 consumers of the stream see them as headers.

The encoding is written here, for this one shape of message, rather than built as rstream's
``AMQPMessage`` and encoded by its general AMQP 1.0 encoder (pure Python, walking every value
with its type rules): that took about ten times as long per message, most of the target's
time. The tests decode what this writes with rstream's own decoder.

Sizes: a message travels in one publish frame, which the broker refuses (closing the
connection) if it is over the connection's ``frame_max``; :func:`oversize` checks that before
sending, so such an event fails alone, at emit already.
"""

from __future__ import annotations

import struct

from tidings.events.outbox import OutboxEvent
from tidings.targets.destination import DestinationTemplate
from tidings.targets.kinds.rabbitmq.messages import message_headers

#: The frame size the target asks for, RabbitMQ's default ``stream.frame_max`` (1 MiB).
DEFAULT_FRAME_MAX = 1_048_576
#: The smallest ``frame_max`` the configuration takes (the protocol's own minimum is lower;
#: below this even a small event with headers would not fit).
MIN_FRAME_MAX = 8192
#: A publish frame's own bytes: size, key, version, publisher id and message count.
FRAME_OVERHEAD = 13
#: Each message's bytes in a publish frame beyond its data: publishing id and data length.
MESSAGE_OVERHEAD = 12
#: A stream is a queue: its name is at most 255 bytes.
MAX_STREAM_NAME = 255


def _stream_value(value: str) -> str | None:
    return None  # any value may stand in a stream name; the whole name is checked per event


def stream_template(text: str) -> DestinationTemplate:
    """A ``stream`` template parsed (ValueError names a bad placeholder)."""
    return DestinationTemplate(text, _stream_value)


def stream_problem(name: str) -> str | None:
    """Why a rendered stream name cannot be used (None if it can)."""
    size = len(name.encode())
    if size > MAX_STREAM_NAME:
        return f"the stream name is {size} bytes, over RabbitMQ's {MAX_STREAM_NAME}"
    if name.startswith("amq."):
        return f"the stream name {name!r} starts with 'amq.', which RabbitMQ reserves"
    return None


def message(event: OutboxEvent) -> bytes:
    """The AMQP 1.0 message of ``event``: its properties, application properties and body
    (a ``data`` section), as the stream stores it."""
    correlation = _NULL if event.correlation_id is None else _string(event.correlation_id)
    fields = b"".join(
        (
            _string(event.event_id),  # message-id
            _NULL * 4,  # user-id, to, subject, reply-to
            correlation,
            _JSON,  # content-type
            _NULL,  # content-encoding
            _NULL,  # absolute-expiry-time
            b"\x83" + _INT64.pack(int(event.logged_at.timestamp() * 1000)),  # creation-time
        )
    )
    pairs = [_string(text) for item in message_headers(event).items() for text in item]
    body = event.payload.encode()
    return b"".join(
        (
            _PROPERTIES,
            _compound(b"\xd0", 10, fields),
            _APPLICATION_PROPERTIES,
            _compound(b"\xd1", len(pairs), b"".join(pairs)),
            _DATA,
            b"\xb0",
            _UINT32.pack(len(body)),
            body,
        )
    )


#: AMQP 1.0 section descriptors (described types 0x73, 0x74, 0x75) and fixed values.
_PROPERTIES, _APPLICATION_PROPERTIES, _DATA = b"\x00\x53\x73", b"\x00\x53\x74", b"\x00\x53\x75"
_NULL = b"\x40"
_JSON = b"\xa3\x10application/json"  # sym8
_UINT32, _INT64 = struct.Struct(">I"), struct.Struct(">q")


def _string(text: str) -> bytes:
    """An AMQP 1.0 string: str8-utf8, or str32-utf8 when over 255 bytes."""
    data = text.encode()
    if len(data) < 256:
        return b"\xa1" + bytes((len(data),)) + data
    return b"\xb1" + _UINT32.pack(len(data)) + data


def _compound(code: bytes, count: int, items: bytes) -> bytes:
    """A list32 or map32: its size (of the count and items), its count, its items."""
    return code + _UINT32.pack(len(items) + 4) + _UINT32.pack(count) + items


def oversize(data: bytes, frame_max: int) -> str | None:
    """Why the broker would refuse a message of ``data`` for its size (None if it fits)."""
    size = FRAME_OVERHEAD + MESSAGE_OVERHEAD + len(data)
    if size > frame_max:
        return (
            f"its message takes {size} bytes in a publish frame, over the connection's "
            f"frame_max of {frame_max} bytes (a message must fit in one frame)"
        )
    return None
