"""Server events as FTN18 events, encoded once and shared by every consumer.

An FTN18 event is ``{"id": "<position>", "type": "<NAME>", "data": <JSON>, "ts":
"YYYY-MM-DDTHH:MM:SSZ"}``: the id is the store position (increasing, gaps allowed, a string
on the wire), ``ts`` the server timestamp cut to the second (the FutoIn client refuses a
fraction), ``data`` the JSON payload. A payload that is not JSON is delivered as
``{"payload_kind": "binary"|"sbs", "base64": "..."}``, and a JSON payload that does not
parse as JSON (the Hat protocol does not check it) as its text, so one odd event never makes a
whole reply invalid. Each event is encoded to bytes once; replies and pushes are built by
joining those bytes.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import Any

from tidings.events.model import PayloadKind, StoredEvent


@dataclass(frozen=True, slots=True)
class WireEvent:
    """One stream event: its position, FTN18 type name and encoded JSON object."""

    position: int
    name: str
    encoded: bytes


def wire_event(event: StoredEvent, name: str) -> WireEvent:
    """Encode ``event`` as an FTN18 event of type ``name``."""
    ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(event.timestamp_us // 1_000_000))
    try:
        data = _dumps(payload_data(event))
    except ValueError:  # NaN or Infinity: JSON has no such numbers
        assert event.payload is not None
        data = _dumps(event.payload.decode("utf-8", "replace"))
    encoded = f'{{"id":"{event.position}","type":"{name}","data":{data},"ts":"{ts}"}}'.encode()
    return WireEvent(event.position, name, encoded)


def payload_data(event: StoredEvent) -> Any:
    """The FTN18 ``data`` of an event (see the module docstring)."""
    if event.payload is None:
        return None
    if event.payload_kind is PayloadKind.JSON:
        try:
            return json.loads(event.payload)
        except ValueError:
            return event.payload.decode("utf-8", "replace")
    return {
        "payload_kind": str(event.payload_kind),
        "base64": base64.b64encode(event.payload).decode(),
    }


def event_list(events: list[WireEvent]) -> bytes:
    """The JSON array of ``events``."""
    return b"[" + b",".join(e.encoded for e in events) + b"]"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
