"""A subscriber's request, from its WebSocket message to a parsed JSON object, each refusal
on the way answered and counted (:class:`.counters.ServingCounters`, by reason).

Kept out of :mod:`.transport` so that module stays about serving; the order of the checks
is the cheap one first: the kind of message, its size, the connection's rate (a token
bucket, :meth:`.connection.Connection.take_token`), then JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tidings.intermediary.serving.connection import Connection
from tidings.intermediary.serving.counters import ServingCounters
from tidings.intermediary.serving.limits import TransportLimits

#: The close codes of a frame the WebSocket itself refused (RFC 6455): too big, and a
#: protocol error or text that is not UTF-8.
TOO_BIG_CODE = 1009
MALFORMED_CODES = frozenset({1002, 1007})


def error(message: str) -> dict[str, object]:
    return {"op": "error", "message": message}


def count_close(message: Mapping[str, Any], counters: ServingCounters) -> None:
    """Count the refusal a disconnect stands for: the WebSocket closed a message too big
    (1009) or malformed (1002, 1007) before the server saw it."""
    code = message.get("code")
    if code == TOO_BIG_CODE:
        counters.refusals["too_large"] += 1
    elif code in MALFORMED_CODES:
        counters.refusals["malformed"] += 1


def parse(
    conn: Connection,
    message: Mapping[str, Any],
    limits: TransportLimits,
    now: float,
    counters: ServingCounters,
) -> dict[str, Any] | tuple[dict[str, object]]:
    """The request ``message`` (an ASGI ``websocket.receive``) carries, or, refused, the
    error reply to send (a 1-tuple, so a request cannot be mistaken for one)."""
    text = message.get("text")
    if text is None:
        reason, reply = "malformed", "request: expected a JSON text message"
    elif len(text) > limits.max_message_bytes:
        reason, reply = "too_large", "request: too long"
    elif not conn.take_token(now, limits.burst, limits.requests_per_s):
        reason, reply = "rate_limited", "request: too many requests, slow down"
    else:
        try:
            request = json.loads(text)
        except ValueError as exc:
            reason, reply = "malformed", f"request: not JSON ({exc})"
        except RecursionError:
            reason, reply = "too_deep", "request: JSON nested too deeply"
        else:
            if isinstance(request, dict):
                return request
            reason, reply = "malformed", "request: expected a JSON object"
    counters.refusals[reason] += 1
    return (error(reply),)
