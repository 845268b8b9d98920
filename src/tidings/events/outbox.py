"""The one event model of tidings, seen from the producer's and the relay's side.

An :class:`OutboxEvent` is a committed row of the event log (the outbox) as the relay reads
it. Targets receive it unchanged and map it to their own representation (an event-store
event, a JetStream message); the ``event_id`` travels everywhere as the dedup key. It lives
beside the server's model (:mod:`tidings.events.model`) because both are sides of one event:
the producer, the relay and every target read it, and none of them owns it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class EventStatus(StrEnum):
    """Publication state of an outbox row (patent [0029]-[0030], design doc publish_state)."""

    PENDING = "PENDING"  # committed, not yet published everywhere
    HELD = "HELD"  # waits behind an earlier unpublished event of the same partition key
    PUBLISHED = "PUBLISHED"  # every routed target confirmed
    FAILED = "FAILED"  # a target still refuses it after every retry; replay may try again
    UNROUTABLE = "UNROUTABLE"  # no route for its type when it was relayed; resubmit re-drives
    PARKED = "PARKED"  # set aside by an operator with a reason: its key flows on without it


#: Statuses the relay still works on (a PARKED or UNROUTABLE event waits for an operator's
#: resubmit instead). Housekeeping deletes none of these, nor parked or unroutable events.
OPEN_STATUSES: frozenset[EventStatus] = frozenset(
    {EventStatus.PENDING, EventStatus.HELD, EventStatus.FAILED}
)


class DeliveryState(StrEnum):
    """State of one event at one target (claim 8: a retry re-sends only where it failed)."""

    CONFIRMED = "confirmed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """A committed event as read from the event log, in log (``seq``) order."""

    seq: int
    event_id: str
    event_type: str
    payload: str  # JSON text, already passed through the transformer
    logged_at: datetime
    version: str = "1"
    correlation_id: str | None = None
    originator: str | None = None
    partition_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ordering_key(self) -> str:
        """The key whose order must be kept; an event without a partition key orders alone."""
        return self.partition_key if self.partition_key is not None else f"\0{self.event_id}"
