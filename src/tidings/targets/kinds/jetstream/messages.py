"""What the JetStream target puts on the wire and reads back: subjects, headers, sizes, acks
and errors.

Subjects are ``<subject_prefix>.<token>``, where the token is the event type with every
character a NATS subject token may not hold (whitespace, ``.``, ``*``, ``>``) replaced by
``_`` (and ``_`` for an empty type). The mapping is deterministic but not injective
(``order.created`` and ``order_created`` share a subject), so consumers that need the exact
type read the ``Tidings-Event-Type`` header. A ``subject_template`` instead fills each
placeholder with the event's value as it is; a value that is not one valid token fails that
event at the target (:func:`token_problem`).

The message is one concern (what consumers read, what the server counts against its
``max_payload``, what an ack or an error says), the connection another:
:mod:`tidings.targets.kinds.jetstream.target` holds the connection, its loop and the publish
calls, and uses these.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tidings.events.outbox import OutboxEvent
from tidings.targets.destination import DestinationTemplate

if TYPE_CHECKING:  # nats-py is loaded only by a process that connects (see the target module)
    from nats.aio.client import Client
    from nats.aio.msg import Msg

_UNSAFE_TOKEN_CHARS = re.compile(r"[\s.*>]")

#: Headers the target sets itself. A custom header of the same name (in any letter case)
#: is dropped, so these always mean what the target says they mean.
_TIDINGS_HEADERS = (
    "Tidings-Event-Type",
    "Tidings-Event-Version",
    "Tidings-Seq",
    "Tidings-Logged-At",
    "Tidings-Correlation-Id",
    "Tidings-Originator",
    "Tidings-Partition-Key",
)
_RESERVED_NAMES = frozenset(h.lower() for h in _TIDINGS_HEADERS)
#: ``Nats-*`` headers steer the server (dedup id, expected stream/sequence, rollup, TTL);
#: letting a producer set them could defeat deduplication or purge the stream.
_RESERVED_PREFIX = "nats-"


def subject_token(event_type: str) -> str:
    """Map an event type to one valid NATS subject token (see the module docstring)."""
    return _UNSAFE_TOKEN_CHARS.sub("_", event_type) or "_"


def token_problem(value: str) -> str | None:
    """Why a placeholder's value cannot stand in a subject (None if it can).

    Unlike an event type under ``subject_prefix``, a template's value is used as it is:
    mapping it would silently send two different values to one subject.
    """
    if not value:
        return "empty, and a NATS subject token cannot be"
    if bad := sorted(set(_UNSAFE_TOKEN_CHARS.findall(value))):
        return f"a NATS subject token cannot hold {' '.join(repr(c) for c in bad)}"
    return None


def subject_template(text: str) -> DestinationTemplate:
    """A ``subject_template`` parsed with the NATS token rule (ValueError if it is bad)."""
    return DestinationTemplate(text, token_problem)


def subject_filter(template: DestinationTemplate) -> str:
    """The NATS subject filter of every subject ``template`` can render (a token with a
    placeholder becomes ``*``): what the stream must capture."""
    tokens = template.literal_shape("\0").split(".")
    return ".".join("*" if "\0" in token else token for token in tokens)


def _is_reserved(header: str) -> bool:
    name = header.strip().lower()
    return name.startswith(_RESERVED_PREFIX) or name in _RESERVED_NAMES


def message_headers(event: OutboxEvent) -> dict[str, str]:
    """The NATS headers of ``event``: custom ones first, then the reserved ones that win."""
    headers = {k: v for k, v in event.headers.items() if not _is_reserved(k)}
    headers["Nats-Msg-Id"] = event.event_id
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


def header_block_size(headers: Mapping[str, str]) -> int:
    """Bytes of the header block nats-py sends (``NATS/1.0``, one line per header, blank line).

    The NATS server counts these in ``max_payload`` together with the payload.
    """
    size = len(b"NATS/1.0\r\n") + 2
    for key, value in headers.items():
        size += len(key.strip().encode()) + len(value.strip().encode()) + 4
    return size


def ack_error(reply: Msg, stream: str) -> str | None:
    """Why a JetStream reply is not a store confirmation for ``stream``; None if it is one.

    A duplicate ack (``"duplicate": true``) is a confirmation: the event is in the stream.
    """
    if reply.headers and (status := reply.headers.get("Status")):
        if status == "503":
            return "no stream takes this subject (no responders)"
        return f"status {status} {reply.headers.get('Description', '')}".rstrip()
    try:
        ack = json.loads(reply.data)
    except ValueError:
        return f"unreadable ack {reply.data[:200]!r}"
    if (error := ack.get("error")) is not None:
        return f"JetStream error {error.get('err_code')}: {error.get('description')}"
    if ack.get("stream") != stream:
        # Another stream captures our subjects (a misconfiguration when create_stream is off).
        return f"stored in stream {ack.get('stream')!r}, not in {stream!r}"
    return None


class AckInbox:
    """Matches JetStream acks to publishes through one wildcard inbox subscription.

    nats-py's ``publish_async`` does the same, but per message it also draws random bytes
    for the token, runs a semaphore and a done callback, and builds a ``PubAck`` dataclass;
    that costs more than a third of the target's CPU per message. Here a reply subject is a
    counter and an ack stays the raw reply until :func:`ack_error` reads it.
    """

    def __init__(self, nc: Client, lost: asyncio.Event) -> None:
        self.nc = nc
        self.lost = lost  # set once the connection is gone: missing acks will not come
        self._prefix = f"{nc.new_inbox()}."
        self._counter = 0
        self._waiting: dict[str, asyncio.Future[Msg]] = {}

    async def start(self) -> None:
        await self.nc.subscribe(f"{self._prefix}*", cb=self._on_reply)

    def expect(self) -> tuple[str, asyncio.Future[Msg]]:
        """A fresh reply subject and the future its ack will complete."""
        self._counter += 1
        reply = f"{self._prefix}{self._counter}"
        future = self._waiting[reply] = asyncio.get_running_loop().create_future()
        return reply, future

    def forget(self, reply: str) -> None:
        """Stop waiting for ``reply`` (acked, failed to send, or given up on)."""
        self._waiting.pop(reply, None)

    async def _on_reply(self, msg: Msg) -> None:
        future = self._waiting.pop(msg.subject, None)
        if future is not None and not future.done():
            future.set_result(msg)


def describe(exc: BaseException) -> str:
    """Name the exception type too: several nats-py errors have empty or generic texts."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
