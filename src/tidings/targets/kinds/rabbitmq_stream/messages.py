"""What the ``rabbitmq_stream`` target puts in a stream: AMQP 1.0 messages, and their sizes.

A message is the event's payload as its body (AMQP 1.0 ``data``), with these properties:
``message_id`` the event id, ``correlation_id`` the event's, ``content_type``
``application/json``, ``creation_time`` its logged-at (milliseconds); its application
properties are the same headers the ``rabbitmq`` target sends (the custom headers, then
``Tidings-Event-Type``, ``Tidings-Seq``...:
:func:`~tidings.targets.kinds.rabbitmq.messages.message_headers`), so a consumer reads
either kind alike, and RabbitMQ's AMQP 0-9-1 consumers of the stream see them as headers.

Sizes: a message travels in one publish frame, which the broker refuses (closing the
connection) if it is over the connection's ``frame_max``; :func:`oversize` checks that before
sending, so such an event fails alone, at emit already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidings.events.outbox import OutboxEvent
from tidings.targets.destination import DestinationTemplate
from tidings.targets.kinds.rabbitmq.messages import message_headers

if TYPE_CHECKING:  # rstream is imported where a message is built: validating a
    # configuration (every Spark worker does) does not load it.
    from rstream import AMQPMessage

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


def message(event: OutboxEvent) -> AMQPMessage:
    """The AMQP 1.0 message of ``event`` (its publishing id is set when it is sent)."""
    from rstream import AMQPMessage, Properties

    return AMQPMessage(
        body=event.payload.encode(),
        properties=Properties(
            message_id=event.event_id,
            correlation_id=event.correlation_id,
            content_type="application/json",
            creation_time=int(event.logged_at.timestamp() * 1000),
        ),
        application_properties=dict(message_headers(event)),
    )


def oversize(data: bytes, frame_max: int) -> str | None:
    """Why the broker would refuse a message of ``data`` for its size (None if it fits)."""
    size = FRAME_OVERHEAD + MESSAGE_OVERHEAD + len(data)
    if size > frame_max:
        return (
            f"its message takes {size} bytes in a publish frame, over the connection's "
            f"frame_max of {frame_max} bytes (a message must fit in one frame)"
        )
    return None
