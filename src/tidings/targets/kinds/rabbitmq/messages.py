"""What the RabbitMQ target puts on the wire: routing keys, properties, headers and sizes.

A message is the event's payload as its body, with these properties: ``message_id`` the
event id (what a consumer de-duplicates by, and what aiormq matches a returned message to
its publish by), ``correlation_id`` the event's, ``timestamp`` its logged-at,
``content_type`` ``application/json``, delivery mode 2 (persistent) unless configured
otherwise, and as headers the event's custom headers followed by its fields
(``Tidings-Event-Type``, ``Tidings-Seq``...), the same names the JetStream target uses.

A custom header named like one of the target's own (in any letter case) is dropped, and so
are ``CC`` and ``BCC``: RabbitMQ reads those as extra routing keys (sender-selected
distribution), and a producer's header must not send an event to queues the route does not
name.

Sizes: RabbitMQ refuses a body over its ``max_message_size`` by closing the channel, and a
content header (the properties, headers included) must fit in one frame of the
connection's ``frame_max``; both are checked before sending (:func:`oversize`), so such an
event fails alone, at emit already.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from tidings.events.outbox import OutboxEvent
from tidings.targets.destination import DestinationTemplate

if TYPE_CHECKING:  # pamqp is imported where a message is built: validating a configuration
    # (every Spark worker does) loads neither it nor aiormq.
    from pamqp.commands import Basic

#: RabbitMQ's default ``max_message_size`` (3.8 and later): 128 MiB.
DEFAULT_MAX_MESSAGE_SIZE = 128 * 1024 * 1024
#: RabbitMQ's default ``frame_max`` (what a connection's tune announces unless configured).
DEFAULT_FRAME_MAX = 131_072
#: A frame's own bytes around its payload: type, channel, size, and the end octet.
_FRAME_OVERHEAD = 8
#: AMQP's short strings (routing keys, exchange names, message ids): at most 255 bytes.
MAX_SHORTSTR = 255

_TIDINGS_HEADERS = (
    "Tidings-Event-Type",
    "Tidings-Event-Version",
    "Tidings-Seq",
    "Tidings-Logged-At",
    "Tidings-Correlation-Id",
    "Tidings-Originator",
    "Tidings-Partition-Key",
)
_RESERVED = frozenset(h.lower() for h in _TIDINGS_HEADERS) | {"cc", "bcc"}


def routing_key_template(text: str) -> DestinationTemplate:
    """A ``routing_key`` parsed (ValueError names a bad placeholder). Any value may stand in
    a routing key; the whole key's length is checked per event (:func:`routing_key_problem`)."""
    return DestinationTemplate(text, lambda _: None)


def routing_key_problem(key: str) -> str | None:
    """Why a rendered routing key cannot be sent (None if it can)."""
    size = len(key.encode())
    if size > MAX_SHORTSTR:
        return f"the routing key is {size} bytes, over AMQP's {MAX_SHORTSTR}"
    return None


def message_headers(event: OutboxEvent) -> dict[str, str]:
    """The AMQP headers of ``event``: custom ones first, then the target's own, which win."""
    headers = {k: v for k, v in event.headers.items() if k.strip().lower() not in _RESERVED}
    headers["Tidings-Event-Type"] = event.event_type
    headers["Tidings-Event-Version"] = event.version
    headers["Tidings-Seq"] = str(event.seq)
    headers["Tidings-Logged-At"] = event.logged_at.isoformat()
    if event.correlation_id is not None:
        headers["Tidings-Correlation-Id"] = event.correlation_id
    if event.originator is not None:
        headers["Tidings-Originator"] = event.originator
    if event.partition_key is not None:
        headers["Tidings-Partition-Key"] = event.partition_key
    return headers


def message_properties(event: OutboxEvent, persistent: bool) -> Basic.Properties:
    """The AMQP properties of ``event``'s message (ValueError if pamqp refuses one)."""
    from pamqp.commands import Basic

    correlation = event.correlation_id
    if correlation is not None and len(correlation.encode()) > MAX_SHORTSTR:
        correlation = None  # too long for the property; the header still carries it
    return Basic.Properties(
        content_type="application/json",
        delivery_mode=2 if persistent else 1,
        message_id=event.event_id,
        correlation_id=correlation,
        timestamp=_whole_seconds(event.logged_at),
        headers=dict(message_headers(event)),
    )


def header_frame_size(body_size: int, properties: Basic.Properties) -> int:
    """Bytes of the content header frame (properties and headers) of a message."""
    from pamqp.header import ContentHeader

    return len(ContentHeader(body_size=body_size, properties=properties).marshal()) + (
        _FRAME_OVERHEAD
    )


def oversize(
    body_size: int, properties: Basic.Properties, max_message_size: int, frame_max: int
) -> str | None:
    """Why the broker would refuse this message for its size (None if it fits)."""
    if body_size > max_message_size:
        return (
            f"the payload is {body_size} bytes, over the broker's max_message_size of "
            f"{max_message_size} bytes"
        )
    header = header_frame_size(body_size, properties)
    if header > frame_max:
        return (
            f"its properties and headers take {header} bytes, over the connection's frame_max "
            f"of {frame_max} bytes (they must fit in one frame)"
        )
    return None


def _whole_seconds(stamp: datetime) -> datetime:
    """AMQP timestamps are whole seconds; the exact instant is ``Tidings-Logged-At``."""
    return stamp.replace(microsecond=0)


def describe(exc: BaseException) -> str:
    """Name the exception type too: several aiormq errors have empty or generic texts."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
