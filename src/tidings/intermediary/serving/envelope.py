"""The subscriber wire's messages apart from JSON: the binary envelope of a frame (a one-byte
key length, the key in UTF-8, then the frame in :mod:`.generation`'s layout) and the close
codes a server ends a subscriber's connection with. The server (:mod:`.transport`) writes
them and the clients (:mod:`tidings.intermediary.client`) read them.
"""

from __future__ import annotations

from tidings.errors import IntermediaryError
from tidings.intermediary.node.intermediary import MAX_KEY_BYTES

#: The close code of a subscriber disconnected for dropping too many frames (application
#: range 4000-4999: "too slow").
DROPPED_CLOSE_CODE = 4008
#: The close code when the server is at its connection limit.
FULL_CLOSE_CODE = 1013
#: The most bytes of a close reason (the WebSocket limit is 123).
MAX_REASON_BYTES = 120


def envelope(key: str, frame: bytes) -> bytes:
    """The binary message of one frame: key length (u8), key (UTF-8), frame."""
    raw = key.encode()
    if len(raw) > MAX_KEY_BYTES:
        raise IntermediaryError(f"key: longer than {MAX_KEY_BYTES} bytes")
    return bytes((len(raw),)) + raw + frame


def open_envelope(message: bytes) -> tuple[str, bytes]:
    """The key and the frame of a binary message (see :func:`envelope`)."""
    if not message:
        raise IntermediaryError("frame: empty message")
    n = message[0]
    if len(message) < 1 + n:
        raise IntermediaryError("frame: message shorter than its key")
    try:
        key = message[1 : 1 + n].decode()
    except UnicodeDecodeError:
        raise IntermediaryError("frame: the key is not UTF-8") from None
    return key, message[1 + n :]


def clip_reason(reason: str) -> str:
    """``reason`` cut to what a close frame carries (:data:`MAX_REASON_BYTES` of UTF-8)."""
    return reason.encode()[:MAX_REASON_BYTES].decode(errors="ignore")


def status_message(upstream: str, stale: str | None) -> dict[str, object]:
    """The message that tells every subscriber an upstream (``event_server`` or ``spatial``)
    was lost (``stale``: why; what is served is its last state, and it reconnects) or is
    back and caught up (``stale`` None). Subscriptions stay as they are either way."""
    message: dict[str, object] = {"op": "status", "upstream": upstream, "stale": stale is not None}
    if stale is not None:
        message["reason"] = stale
    return message
