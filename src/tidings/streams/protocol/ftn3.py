"""FutoIn FTN3 messages: what a request and a reply look like, and how they are checked.

A request is one JSON object ``{"f": "<iface>:<major>.<minor>:<func>", "p": {...},
"rid": "C1", "sec": "user:password"}``; a reply is ``{"r": <result>}`` or ``{"e":
"<ErrorName>", "edesc": "<text>"}``, with the request's ``rid`` on a WebSocket. The FutoIn
client refuses fields it does not know, so replies carry exactly these. Everything a peer
sends is checked here before any stream code sees it, and a bad message becomes a
:class:`~tidings.errors.StreamError` whose name the peer gets back (``InvalidRequest``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tidings.errors import StreamError

#: FTN3 standard error names (the FutoIn client passes these through from any function).
INVALID_REQUEST = "InvalidRequest"
UNKNOWN_INTERFACE = "UnknownInterface"
NOT_SUPPORTED_VERSION = "NotSupportedVersion"
NOT_IMPLEMENTED = "NotImplemented"
SECURITY_ERROR = "SecurityError"
INTERNAL_ERROR = "InternalError"
#: FTN18's own errors.
NOT_REGISTERED = "NotRegistered"
LIVE_NOT_ALLOWED = "LiveNotAllowed"

#: What a message nested deeper than the interpreter can follow is told.
NESTED_TOO_DEEPLY = "the message is nested too deeply"
#: The fields FTN3 allows in a request.
_REQUEST_FIELDS = frozenset({"f", "p", "forcersp", "obf", "rid", "sec"})
#: The fields of a reply to a call this side made (push: the consumer's onEvents replies).
_REPLY_FIELDS = frozenset({"r", "e", "edesc", "rid", "sec"})
_FUNCTION = re.compile(
    r"^(?P<iface>[a-z][a-z0-9]*(?:\.[a-z][a-z0-9]*)+):(?P<major>\d{1,4})\.(?P<minor>\d{1,4}):"
    r"(?P<func>[a-zA-Z_][a-zA-Z0-9_]{0,63})$"
)
_RID = re.compile(r"^[CS][0-9]{1,18}$")


@dataclass(frozen=True, slots=True)
class Request:
    """One checked FTN3 request."""

    iface: str
    major: int
    minor: int
    func: str
    params: dict[str, Any]
    rid: str | None
    sec: str | None


@dataclass(frozen=True, slots=True)
class Reply:
    """A peer's reply to a call this side made: ``result``, or the error ``error``."""

    rid: str
    result: Any = None
    error: str | None = None
    description: str = ""


def decode(data: str | bytes) -> dict[str, Any]:
    """One FTN3 message as a JSON object, or :data:`INVALID_REQUEST`."""
    try:
        message = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StreamError(INVALID_REQUEST, f"the message is not JSON: {exc}") from None
    except RecursionError:
        # A few KB of "[[[[..." (a cheap request, sent without login) must be the sender's
        # mistake, answered as such, not an internal error with a traceback each time.
        raise StreamError(INVALID_REQUEST, NESTED_TOO_DEEPLY) from None
    if not isinstance(message, dict):
        raise StreamError(INVALID_REQUEST, "the message is not a JSON object")
    return message


def is_request(message: dict[str, Any]) -> bool:
    """A request names a function; anything else is a reply."""
    return "f" in message


def parse_request(message: dict[str, Any]) -> Request:
    """Check a decoded request; the error names what is wrong with it."""
    unknown = set(message) - _REQUEST_FIELDS
    if unknown:
        raise StreamError(INVALID_REQUEST, f"unknown request fields: {', '.join(sorted(unknown))}")
    function = message.get("f")
    match = _FUNCTION.match(function) if isinstance(function, str) else None
    if match is None:
        raise StreamError(
            INVALID_REQUEST, f"f must be '<iface>:<major>.<minor>:<function>', not {function!r}"
        )
    params = message.get("p", {})
    if not isinstance(params, dict):
        raise StreamError(INVALID_REQUEST, "p must be a JSON object of parameters")
    rid = message.get("rid")
    if rid is not None and not (isinstance(rid, str) and _RID.match(rid)):
        raise StreamError(INVALID_REQUEST, f"rid must be like C1 or S1, not {rid!r}")
    sec = message.get("sec")
    if sec is not None and not isinstance(sec, str):
        raise StreamError(SECURITY_ERROR, "sec must be a string")
    return Request(
        match["iface"],
        int(match["major"]),
        int(match["minor"]),
        match["func"],
        params,
        rid,
        sec,
    )


def parse_reply(message: dict[str, Any]) -> Reply:
    """Check a decoded reply to one of this side's calls."""
    unknown = set(message) - _REPLY_FIELDS
    if unknown:
        raise StreamError(INVALID_REQUEST, f"unknown reply fields: {', '.join(sorted(unknown))}")
    rid = message.get("rid")
    if not isinstance(rid, str) or not _RID.match(rid):
        raise StreamError(INVALID_REQUEST, f"a reply needs the rid of its call, not {rid!r}")
    error = message.get("e")
    if error is not None:
        return Reply(rid, error=str(error), description=str(message.get("edesc", "")))
    if "r" not in message:
        raise StreamError(INVALID_REQUEST, "a reply has neither r nor e")
    return Reply(rid, result=message["r"])


def outcome(message: dict[str, Any]) -> Any:
    """The result a decoded reply carries, or the StreamError it names (a caller's view)."""
    if "e" in message:
        raise StreamError(str(message["e"]), str(message.get("edesc", "")))
    return message.get("r")


def request(function: str, params: dict[str, Any], rid: str | None, sec: str | None) -> bytes:
    """An encoded request (``sec`` omitted when ``None``, as the FutoIn client does)."""
    message: dict[str, Any] = {"f": function, "p": params}
    if rid is not None:
        message["rid"] = rid
    if sec is not None:
        message["sec"] = sec
    return encode(message)


def result(value: Any, rid: str | None) -> bytes:
    """An encoded successful reply."""
    return encode({"r": value} if rid is None else {"r": value, "rid": rid})


def error(exc: StreamError, rid: str | None) -> bytes:
    """An encoded error reply."""
    message: dict[str, Any] = {"e": exc.name, "edesc": exc.description}
    if rid is not None:
        message["rid"] = rid
    return encode(message)


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
