"""The event as the event server keeps it: Hat's model, shared by every part that handles one.

The store, the engine, the wire codec, the client and the targets all speak of events in
these terms, so they live here, below all of them, rather than in any one of them. As in
Hat, an event id is ``(server, session, instance)`` with 0 reserved for "before the first",
a type is a tuple of strings, and a payload is binary, JSON or SBS bytes that are never
decoded on the way. A stored event also carries its ``position`` in one store's log (the
cursor of stream consumers) and the outbox event id it came from (the dedup key).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

#: A Hat event type: a non-empty tuple of strings, none of them ``?`` or ``*``.
EventType = tuple[str, ...]


@lru_cache(maxsize=65_536)
def encode_type(event_type: EventType) -> str:
    """A type's text as the stores keep and index it: canonical compact JSON, so equal
    types give equal, indexable text.

    ASCII-only escaping keeps any string storable, lone surrogates and NUL included; type
    queries must encode their prefixes with this same function. Cached: registrations
    repeat few types, and encoding one was a tenth of a batch register's Python time.
    """
    return json.dumps(list(event_type), separators=(",", ":"))


class PayloadKind(StrEnum):
    """How a payload is encoded (Hat: binary, JSON or SBS); the store never decodes it."""

    BINARY = "binary"
    JSON = "json"
    SBS = "sbs"


@dataclass(frozen=True, slots=True, order=True)
class EventId:
    """Hat event id; ordered so that a later event of one server compares greater."""

    server: int
    session: int
    instance: int


@dataclass(frozen=True, slots=True)
class NewEvent:
    """What a register asks for; the store adds id, timestamp and position."""

    type: EventType
    payload: bytes | None = None
    payload_kind: PayloadKind | None = None
    source_timestamp_us: int | None = None
    outbox_event_id: str | None = None


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as stored; timestamps are integer microseconds since the Unix epoch."""

    position: int
    id: EventId
    type: EventType
    timestamp_us: int
    source_timestamp_us: int | None
    payload: bytes | None
    payload_kind: PayloadKind | None
    outbox_event_id: str | None


def json_event(
    event_type: EventType,
    value: Any,
    source_timestamp_us: int | None = None,
    *,
    outbox_event_id: str | None = None,
) -> NewEvent:
    """A new event with ``value`` as its JSON payload (the common case in hat-event, and
    how the server's own status events are made)."""
    payload = json.dumps(value).encode()
    return NewEvent(
        tuple(event_type), payload, PayloadKind.JSON, source_timestamp_us, outbox_event_id
    )
