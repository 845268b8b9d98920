"""Server events as FTN18 events, encoded once and shared by every consumer.

An FTN18 event is ``{"id": "<position>", "type": "<NAME>", "data": <JSON>, "ts":
"YYYY-MM-DDTHH:MM:SSZ"}``: the id is the store position (increasing, gaps allowed, a string
on the wire), ``ts`` the server timestamp cut to the second (the FutoIn client refuses a
fraction), ``data`` the JSON payload. A payload that is not JSON is delivered as
``{"payload_kind": "binary"|"sbs", "base64": "..."}``, and a JSON payload that does not
parse as strict JSON (the Hat protocol does not check it; NaN is not JSON) as its text, so
one odd event never makes a whole reply invalid. A payload that is strict JSON goes out as it
is stored, without being decoded and encoded again. Each event is encoded to bytes once;
replies and pushes are built by joining those bytes.
"""

from __future__ import annotations

import base64
import functools
import time
from dataclasses import dataclass
from typing import Any

import orjson

from tidings.events.model import PayloadKind, StoredEvent


@dataclass(frozen=True, slots=True)
class WireEvent:
    """One stream event: its position, FTN18 type name and encoded JSON object."""

    position: int
    name: str
    encoded: bytes


def wire_event(event: StoredEvent, name: str) -> WireEvent:
    """Encode ``event`` as an FTN18 event of type ``name``."""
    data = _data(event)
    ts = _second(event.timestamp_us // 1_000_000)
    encoded = b'{"id":"%d","type":"%s","data":%s,"ts":"%s"}' % (
        event.position,
        name.encode(),
        data,
        ts,
    )
    return WireEvent(event.position, name, encoded)


def _data(event: StoredEvent) -> bytes:
    """The encoded ``data``: a JSON payload as it is stored when it is strict JSON (checked
    by orjson, which refuses NaN and the like: no re-encoding), else :func:`payload_data`."""
    if event.payload is None:
        return b"null"
    if event.payload_kind is PayloadKind.JSON:
        try:
            orjson.loads(event.payload)
            return event.payload
        except orjson.JSONDecodeError:
            return orjson.dumps(event.payload.decode("utf-8", "replace"))
    return orjson.dumps(payload_data(event))


@functools.lru_cache(maxsize=4096)
def _second(epoch_s: int) -> bytes:
    """``YYYY-MM-DDTHH:MM:SSZ`` of a second (events of one second share it)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s)).encode()


def payload_data(event: StoredEvent) -> Any:
    """The FTN18 ``data`` of an event (see the module docstring)."""
    if event.payload is None:
        return None
    if event.payload_kind is PayloadKind.JSON:
        try:
            return orjson.loads(event.payload)
        except orjson.JSONDecodeError:
            return event.payload.decode("utf-8", "replace")
    return {
        "payload_kind": str(event.payload_kind),
        "base64": base64.b64encode(event.payload).decode(),
    }


def event_list(events: list[WireEvent]) -> bytes:
    """The JSON array of ``events``."""
    return b"[" + b",".join(e.encoded for e in events) + b"]"
