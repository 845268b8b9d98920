"""What an emit accepts: its arguments checked and made into a draft, and the draft's body.

Every check raises :class:`~tidings.errors.EmitError` naming the argument, the value and the
bound it broke, before the caller's transaction is touched. Text must be storable as it is by
every backend and broker (no NUL, valid UTF-8); header names are HTTP/NATS tokens; sizes are
bounded where a target or a header block would refuse them later, far from the code that
caused it. The :class:`~tidings.outbox.producer.Outbox` calls these and then writes.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from tidings.errors import EmitError
from tidings.events.ids import new_id
from tidings.events.timeutil import utcnow
from tidings.outbox.envelope import EventDraft, JsonDefault, Transformer

# An HTTP/NATS header token: what every broker accepts as a header name.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: Header bounds, in UTF-8 bytes. Headers travel with every copy of the event (NATS counts
#: them in max_payload, HTTP stacks commonly cap a header block at 8-16 KiB); they are for
#: routing metadata, not data, so the bounds are generous for the one and tight for the other.
MAX_HEADER_NAME_BYTES = 256
MAX_HEADER_VALUE_BYTES = 8 * 1024
MAX_HEADERS_BYTES = 16 * 1024


def make_draft(
    event_type: Any,
    payload: Any,
    *,
    partition_key: Any,
    correlation_id: Any,
    headers: Mapping[str, str] | None,
    version: Any,
    event_id: Any,
    originator: str,
) -> EventDraft:
    """The event an emit describes, its arguments checked; a fresh time-ordered UUID
    (:mod:`tidings.events.ids`) if it names none."""
    check_event_type(event_type)
    _check_text("partition key", partition_key)
    _check_text("correlation id", correlation_id, limit=64)
    _check_text("version", version, required=True, limit=32)
    if event_id is None:
        event_id = new_id()
    else:
        try:
            event_id = str(uuid.UUID(str(event_id)))
        except ValueError:
            raise EmitError(f"event id {event_id!r} is not a UUID") from None
    clean_headers = _check_headers(headers)
    return EventDraft(
        event_id=event_id,
        event_type=event_type,
        payload=payload,
        logged_at=utcnow(),
        version=version,
        originator=originator,
        correlation_id=correlation_id,
        partition_key=partition_key,
        headers=clean_headers,
    )


def encode_body(
    draft: EventDraft,
    transformer: Transformer,
    max_payload_bytes: int,
    json_default: JsonDefault | None = None,
) -> str:
    """The message ``transformer`` makes of ``draft``, as compact JSON within the size limit;
    ``json_default`` encodes what JSON has no type for (its results are checked as strictly:
    no NaN or Infinity)."""
    try:
        body = json.dumps(
            transformer(draft),
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
            default=json_default,
        )
    except (TypeError, ValueError) as exc:
        raise EmitError(
            f"payload of {draft.event_type!r} event is not JSON-serialisable: {exc}"
        ) from None
    try:
        size = len(body.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise EmitError(
            f"payload of {draft.event_type!r} event is not valid UTF-8 text: {exc.reason}"
        ) from None
    if size > max_payload_bytes:
        raise EmitError(
            f"payload of {draft.event_type!r} event is {size} bytes, over the limit of "
            f"{max_payload_bytes} bytes (outbox.max_payload_bytes)"
        )
    return body


def check_event_type(event_type: Any) -> str:
    """``event_type`` if an event may have it, else EmitError: one rule for emit and for
    routes (a route for a type no event can have would never match)."""
    _check_text("event type", event_type, required=True)
    if event_type.strip() in ("*", "?"):
        raise EmitError(f"event type {event_type!r} is a wildcard in event-server queries")
    if "*" in event_type:
        raise EmitError(f"event type {event_type!r} holds a '*', the wildcard of route patterns")
    return str(event_type)


def _check_text(what: str, value: Any, *, required: bool = False, limit: int = 256) -> None:
    if value is None:
        if required:
            raise EmitError(f"{what} is required")
        return
    if not isinstance(value, str) or not value.strip():
        raise EmitError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise EmitError(f"{what} is {len(value)} characters, over the limit of {limit}")
    if not _storable(value):
        raise EmitError(f"{what} {value!r} holds a NUL character or an unpaired surrogate")


def _storable(value: str) -> bool:
    """Text every backend and broker keeps as it is: no NUL, valid UTF-8."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise EmitError(f"headers must be a mapping of strings, got {headers!r}")
    total = 0
    for key, value in headers.items():
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise EmitError(f"header {key!r}: {value!r} is not a pair of strings")
        if not _HEADER_NAME.fullmatch(key):
            raise EmitError(
                f"header name {key!r} is not a token (letters, digits, !#$%&'*+-.^_`|~)"
            )
        if "\r" in value or "\n" in value or not _storable(value):
            raise EmitError(f"header {key!r} value holds a line break, NUL or unpaired surrogate")
        total += _check_header_size(key, value)
    if total > MAX_HEADERS_BYTES:
        raise EmitError(
            f"headers are {total} bytes (names + values), over the limit of "
            f"{MAX_HEADERS_BYTES} bytes"
        )
    return dict(headers)


def _check_header_size(name: str, value: str) -> int:
    """The UTF-8 bytes of one header (name + value), refusing an oversize name or value."""
    name_bytes, value_bytes = len(name), len(value.encode("utf-8"))  # a token is ASCII
    if name_bytes > MAX_HEADER_NAME_BYTES:
        raise EmitError(
            f"header name {name[:32]!r}... is {name_bytes} bytes, over the limit of "
            f"{MAX_HEADER_NAME_BYTES} bytes"
        )
    if value_bytes > MAX_HEADER_VALUE_BYTES:
        raise EmitError(
            f"header {name!r} value is {value_bytes} bytes, over the limit of "
            f"{MAX_HEADER_VALUE_BYTES} bytes"
        )
    return name_bytes + value_bytes
