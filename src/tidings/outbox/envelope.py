"""Hooks the producer calls on every event: the default transformer and extractor types.

The design document lets a service plug in an *attribute extractor* (special attributes
stored beside the event in ``outbox_event_attribute``) and a *transformer* (the shape of
the published message). The default transformer wraps the payload in a CloudEvents 1.0
structured-mode envelope, so consumers get a standard, self-describing message.

The envelope carries the event's custom headers too, as extension attributes
(:func:`header_attributes`), because the envelope is the one part of an event that every
target keeps: the event server's events have no headers of their own, JetStream's messages
do but hold the envelope as well. CloudEvents names must be lower-case letters and digits
(at most 20 advised) and values strings without control characters, while a header name is
any token and its value any text without line breaks; so a header that fits the rules (and
is no name the envelope uses itself) becomes the attribute of its name, and the others
travel together in one attribute, :data:`HEADERS_ATTRIBUTE`, a JSON object in ASCII text.
:func:`envelope_headers` reads them all back, exactly as they were emitted.

A third, optional hook is the *JSON default* (``json.dumps``'s ``default``): what a value
JSON has no type for becomes. :func:`json_default` is a ready-made one for the types a
service's payloads commonly hold (dates, decimals, UUIDs, dataclasses, pydantic models).
"""

from __future__ import annotations

import dataclasses
import json
import re
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


#: The extension attribute holding, as a JSON object in ASCII text, the headers that cannot
#: be attributes of their own (see the module docstring).
HEADERS_ATTRIBUTE = "tidingsheaders"
#: Names no header becomes an attribute of: CloudEvents 1.0's own (``data`` and
#: ``data_base64`` included, which its JSON format uses), the extensions the envelope sets
#: and :data:`HEADERS_ATTRIBUTE`. A header of one of these names travels in the latter.
ENVELOPE_ATTRIBUTES = frozenset(
    {
        "specversion",
        "id",
        "source",
        "type",
        "datacontenttype",
        "dataschema",
        "subject",
        "time",
        "data",
        "data_base64",
        "dataversion",
        "partitionkey",
        "correlationid",
        HEADERS_ATTRIBUTE,
    }
)
#: A CloudEvents attribute name: lower-case ASCII letters and digits, at most 20 (the
#: specification's "SHOULD NOT exceed 20 characters", kept).
_ATTRIBUTE_NAME = re.compile(r"[a-z0-9]{1,20}")
#: Unicode's noncharacters: U+FDD0..U+FDEF and the last two code points of every plane.
_NONCHARACTERS = "\ufdd0-\ufdef" + "".join(
    chr(plane << 16 | 0xFFFE) + chr(plane << 16 | 0xFFFF) for plane in range(17)
)
#: What a CloudEvents String may not hold: control characters, surrogates, noncharacters.
_NOT_STRING = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f\\ud800-\\udfff{_NONCHARACTERS}]")


def header_attributes(headers: Mapping[str, str]) -> dict[str, str]:
    """The extension attributes that carry ``headers`` in a CloudEvents envelope.

    A header whose name is a CloudEvents attribute name not in :data:`ENVELOPE_ATTRIBUTES`
    and whose value is a CloudEvents String is an attribute of its own, so CloudEvents
    tools can filter on it (``tenant``, ``traceparent``); every other one (``Tenant``,
    ``aggregate_type``, ``type``, a value with a tab) goes into :data:`HEADERS_ATTRIBUTE`.
    """
    attributes: dict[str, str] = {}
    others: dict[str, str] = {}
    for name, value in headers.items():
        if (
            name not in ENVELOPE_ATTRIBUTES
            and _ATTRIBUTE_NAME.fullmatch(name)
            and not _NOT_STRING.search(value)
        ):
            attributes[name] = value
        else:
            others[name] = value
    if others:
        attributes[HEADERS_ATTRIBUTE] = json.dumps(others, separators=(",", ":"))
    return attributes


def envelope_headers(envelope: Mapping[str, Any]) -> dict[str, str]:
    """The custom headers a CloudEvents envelope carries (:func:`header_attributes` undone).

    Every string-valued extension attribute but the envelope's own is a header, and so is
    every entry of :data:`HEADERS_ATTRIBUTE`; ValueError if that one is not a JSON object
    of strings.
    """
    headers = {
        name: value
        for name, value in envelope.items()
        if name not in ENVELOPE_ATTRIBUTES and isinstance(value, str)
    }
    packed = envelope.get(HEADERS_ATTRIBUTE)
    if packed is None:
        return headers
    try:
        others = json.loads(packed) if isinstance(packed, str) else None
    except ValueError:
        others = None
    if not isinstance(others, dict) or not all(isinstance(v, str) for v in others.values()):
        raise ValueError(f"{HEADERS_ATTRIBUTE} is not a JSON object of strings: {packed!r:.80}")
    headers.update(others)
    return headers


def cloudevents_envelope(draft: EventDraft) -> dict[str, Any]:
    """Wrap the payload in a CloudEvents 1.0 envelope (JSON structured mode), the headers
    as extension attributes (:func:`header_attributes`)."""
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
    if draft.headers:
        envelope.update(header_attributes(draft.headers))
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
