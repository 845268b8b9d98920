"""What the webhook target sends: one event as a CloudEvents 1.0 HTTP request.

Two content modes, as the CloudEvents HTTP protocol binding defines them:

* **binary**: every attribute is a ``ce-<name>`` header (values percent-encoded where the
  binding says so) and the body is the event's data, typed by ``Content-Type``;
* **structured**: the body is the whole event in the JSON event format,
  ``Content-Type: application/cloudevents+json``.

By default the producer already publishes a CloudEvents envelope
(:func:`tidings.outbox.envelope.cloudevents_envelope`): a payload that is one (a JSON object
with ``specversion`` and the event's own id) is taken as the event, so its attributes,
extensions and data are sent as they are (in structured mode its text is the body, not
encoded again). Any other payload (the ``identity`` transformer) is the data of an event
whose attributes come from the outbox row, as the default envelope makes them: ``id`` the
event id, ``source`` the originator, ``type``, ``time`` the log time, ``subject`` and
``partitionkey`` the partition key, ``correlationid``, and the custom headers as extension
attributes (:func:`tidings.outbox.envelope.header_attributes`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Literal

from tidings.events.outbox import OutboxEvent
from tidings.outbox.envelope import header_attributes

#: The structured mode's media type (the JSON event format).
STRUCTURED_TYPE = "application/cloudevents+json; charset=utf-8"
#: A source for events that have none (no originator, no configured ``source``).
DEFAULT_SOURCE = "tidings"
#: Attributes that are no ``ce-`` header in binary mode: the data and its type (which is
#: the ``Content-Type``).
_NOT_HEADERS = frozenset({"data", "data_base64", "datacontenttype"})
#: A header value that needs no percent-encoding: printable ASCII but space, ``"`` and ``%``.
_PLAIN_VALUE = re.compile(r"^[\x21\x23\x24\x26-\x7e]*$")

Mode = Literal["binary", "structured"]


@dataclass(frozen=True, slots=True)
class Request:
    """The headers and body of one event's POST (without the target's fixed headers)."""

    headers: dict[str, str]
    body: bytes


def cloudevent_request(event: OutboxEvent, mode: Mode, source: str | None) -> Request:
    """``event`` as a CloudEvents request in ``mode``; ``source`` (if given) replaces the
    event's own source."""
    envelope = payload_envelope(event)
    if mode == "structured":
        return _structured(event, envelope, source)
    if envelope is None:
        attributes = row_attributes(event, source)
        return Request(_ce_headers(attributes, "application/json"), event.payload.encode())
    attributes = dict(envelope)
    _fix_source(attributes, source)
    content_type = str(attributes.get("datacontenttype") or "application/json")
    return Request(_ce_headers(attributes, content_type), _data_bytes(attributes, content_type))


def payload_envelope(event: OutboxEvent) -> dict[str, Any] | None:
    """The payload as a CloudEvents event if it is one of this event (the default
    transformer's envelope), else None."""
    text = event.payload.lstrip()
    if not text.startswith("{") or '"specversion"' not in text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if (
        isinstance(value, dict)
        and value.get("specversion") == "1.0"
        and value.get("id") == event.event_id
    ):
        return value
    return None


def row_attributes(event: OutboxEvent, source: str | None) -> dict[str, Any]:
    """The CloudEvents attributes of ``event`` from its outbox row (what the default
    envelope would hold), for a payload that is no envelope."""
    logged_at = event.logged_at
    if logged_at.tzinfo is None:  # the log's times are UTC; RFC 3339 wants the offset
        logged_at = logged_at.replace(tzinfo=UTC)
    attributes: dict[str, Any] = {
        "specversion": "1.0",
        "id": event.event_id,
        "source": source or event.originator or DEFAULT_SOURCE,
        "type": event.event_type,
        "time": logged_at.isoformat(),
        "datacontenttype": "application/json",
        "dataversion": event.version,
    }
    if event.partition_key is not None:
        attributes["subject"] = event.partition_key
        attributes["partitionkey"] = event.partition_key
    if event.correlation_id is not None:
        attributes["correlationid"] = event.correlation_id
    if event.headers:
        attributes.update(header_attributes(event.headers))
    return attributes


def _structured(event: OutboxEvent, envelope: dict[str, Any] | None, source: str | None) -> Request:
    headers = {"Content-Type": STRUCTURED_TYPE}
    if envelope is not None:
        if not _fix_source(envelope, source):
            return Request(headers, event.payload.encode())  # the envelope, as emitted
        return Request(headers, _dumps(envelope).encode())
    attributes = _dumps(row_attributes(event, source))
    # The payload is JSON text already: spliced in as the data, not parsed and encoded again.
    return Request(headers, f'{attributes[:-1]},"data":{event.payload}}}'.encode())


def _fix_source(attributes: dict[str, Any], source: str | None) -> bool:
    """Put the configured ``source`` (or the default, where the event has none) in
    ``attributes``; whether anything changed."""
    wanted = source or attributes.get("source") or DEFAULT_SOURCE
    if attributes.get("source") == wanted:
        return False
    attributes["source"] = wanted
    return True


def _ce_headers(attributes: Mapping[str, Any], content_type: str) -> dict[str, str]:
    """The binary mode's headers: ``Content-Type`` and one ``ce-`` header per attribute."""
    headers = {"Content-Type": content_type}
    for name, value in attributes.items():
        if name in _NOT_HEADERS or value is None:
            continue
        headers[f"ce-{name}"] = header_value(_attribute_text(value))
    return headers


def _attribute_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return _dumps(value)


def header_value(text: str) -> str:
    """``text`` as a ``ce-`` header value: space, ``"``, ``%`` and everything outside
    printable ASCII percent-encoded as UTF-8 (CloudEvents HTTP binding, 3.1.3.2)."""
    if _PLAIN_VALUE.fullmatch(text):
        return text
    out = []
    for char in text:
        if _PLAIN_VALUE.fullmatch(char):
            out.append(char)
        else:
            out.append("".join(f"%{byte:02X}" for byte in char.encode()))
    return "".join(out)


def _data_bytes(attributes: Mapping[str, Any], content_type: str) -> bytes:
    """The binary mode's body: the event's data (``data_base64`` decoded; a string under a
    non-JSON type as it is; anything else as JSON)."""
    if "data_base64" in attributes:
        return base64.b64decode(str(attributes["data_base64"]))
    if "data" not in attributes:
        return b""
    data = attributes["data"]
    if isinstance(data, str) and not _is_json(content_type):
        return data.encode()
    return _dumps(data).encode()


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json") or media == "text/json"


def _dumps(value: Any) -> str:
    """Compact JSON, non-ASCII kept as it is (UTF-8 on the wire)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
