"""Hooks the producer calls on every event: the default transformer and extractor types.

The design document lets a service plug in an *attribute extractor* (special attributes
stored beside the event in ``outbox_event_attribute``) and a *transformer* (the shape of
the published message). The default transformer wraps the payload in a CloudEvents 1.0
structured-mode envelope, so consumers get a standard, self-describing message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class EventDraft:
    """An event as the service emitted it, before it is stored."""

    event_id: str
    event_type: str
    payload: Any
    logged_at: datetime
    version: str
    originator: str
    correlation_id: str | None = None
    partition_key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


Transformer = Callable[[EventDraft], Any]
AttributeExtractor = Callable[[EventDraft], Mapping[str, str | None]]
ExclusionPredicate = Callable[[EventDraft], bool]


def cloudevents_envelope(draft: EventDraft) -> dict[str, Any]:
    """Wrap the payload in a CloudEvents 1.0 envelope (JSON structured mode)."""
    envelope: dict[str, Any] = {
        "specversion": "1.0",
        "id": draft.event_id,
        "source": draft.originator,
        "type": draft.event_type,
        "time": draft.logged_at.isoformat(),
        "datacontenttype": "application/json",
        "dataversion": draft.version,
        "data": draft.payload,
    }
    if draft.partition_key is not None:
        envelope["subject"] = draft.partition_key
        envelope["partitionkey"] = draft.partition_key
    if draft.correlation_id is not None:
        envelope["correlationid"] = draft.correlation_id
    return envelope


def identity(draft: EventDraft) -> Any:
    """A transformer that publishes the payload as it is."""
    return draft.payload
