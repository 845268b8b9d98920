"""Hooks the producer calls on every event: the default transformer and extractor types.

The design document lets a service plug in an *attribute extractor* (special attributes
stored beside the event in ``outbox_event_attribute``) and a *transformer* (the shape of
the published message). The default transformer wraps the payload in a CloudEvents 1.0
structured-mode envelope, so consumers get a standard, self-describing message.

A third, optional hook is the *JSON default* (``json.dumps``'s ``default``): what a value
JSON has no type for becomes. :func:`json_default` is a ready-made one for the types a
service's payloads commonly hold (dates, decimals, UUIDs, dataclasses, pydantic models).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

from pydantic import BaseModel


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
#: ``json.dumps``'s ``default``: a value JSON cannot hold -> one it can (or TypeError).
JsonDefault = Callable[[Any], Any]
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


def json_default(value: Any) -> Any:
    """Encode what JSON has no type for, as ``Outbox(engine, json_default=json_default)``.

    * ``datetime``, ``date``, ``time``: ISO 8601 text (``isoformat()``; a naive datetime
      stays without an offset, so give aware ones);
    * ``Decimal``: its exact text (``"10.50"``), not a float: a JSON number is read as a
      double by most consumers and would lose digits; NaN and infinite decimals are refused
      as float NaN is;
    * ``UUID``: its text; an ``Enum``: its value; ``set`` / ``frozenset``: a sorted list
      (a list in iteration order if the items do not sort), so the same set gives the same
      bytes;
    * a dataclass instance: its fields as a mapping (``dataclasses.asdict``); a pydantic
      model: ``model_dump(mode="json")``.

    Anything else raises TypeError, which emit reports as a payload that is not
    JSON-serialisable. The values returned are encoded by the same strict encoder, so NaN or
    Infinity inside them is refused too.
    """
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{value!r} is not a finite number (JSON has no NaN or Infinity)")
        return str(value)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, set | frozenset):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
