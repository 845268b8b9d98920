"""What one Redis stream entry holds, what Redis will refuse of it, and its errors.

An entry's fields, in this order: ``event_id``, ``event_type``, ``version``, ``seq``,
``logged_at``, then ``correlation_id``, ``originator`` and ``partition_key`` when the event
has them, ``headers`` (the custom headers as one JSON object) when it has any, and
``payload`` (the event's JSON as published). Custom headers are one field, not a field
each, so that no header can stand in for a field of tidings' own.

Redis refuses a bulk string longer than its ``proto-max-bulk-len`` (512 MiB by default)
and a command larger than its ``client-query-buffer-limit`` (1 GiB): those are checked per
event before sending, so an entry Redis would refuse fails alone with its sizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tidings.events.outbox import OutboxEvent

#: Redis's defaults, used until the server's own values are read (or when the ACL user may
#: not read them with ``CONFIG GET``).
DEFAULT_MAX_BULK = 512 * 1024 * 1024
DEFAULT_MAX_QUERY = 1024 * 1024 * 1024
#: Bytes the RESP framing of one argument takes at most (``$<len>\r\n`` ... ``\r\n``).
_FRAMING = 16
#: Errors that say the server cannot take any write now (out of memory, loading its data,
#: a read-only replica, a busy script...), not that this entry is wrong: the call fails as a
#: whole, and while nothing was confirmed the target is down.
SERVER_STATES = ("OOM", "LOADING", "BUSY", "READONLY", "MASTERDOWN", "TRYAGAIN", "NOREPLICAS")


@dataclass(frozen=True, slots=True)
class Limits:
    """What the server refuses: a longer argument, or a larger command."""

    max_bulk: int = DEFAULT_MAX_BULK
    max_query: int = DEFAULT_MAX_QUERY


def entry_fields(event: OutboxEvent) -> dict[bytes, bytes]:
    """The fields of ``event``'s entry (see the module docstring), encoded."""
    fields = {
        b"event_id": event.event_id.encode(),
        b"event_type": event.event_type.encode(),
        b"version": event.version.encode(),
        b"seq": str(event.seq).encode(),
        b"logged_at": event.logged_at.isoformat().encode(),
    }
    if event.correlation_id is not None:
        fields[b"correlation_id"] = event.correlation_id.encode()
    if event.originator is not None:
        fields[b"originator"] = event.originator.encode()
    if event.partition_key is not None:
        fields[b"partition_key"] = event.partition_key.encode()
    if event.headers:
        fields[b"headers"] = json.dumps(event.headers, ensure_ascii=False).encode()
    fields[b"payload"] = event.payload.encode()
    return fields


def oversize(stream: str, fields: dict[bytes, bytes], limits: Limits) -> str | None:
    """Why Redis would refuse ``XADD stream * fields`` (a value or the whole command too
    large), or None."""
    name, longest = max(fields.items(), key=lambda item: len(item[1]))
    if len(longest) > limits.max_bulk:
        return (
            f"field {name.decode()!r} is {len(longest)} bytes, over the server's "
            f"proto-max-bulk-len of {limits.max_bulk} bytes"
        )
    size = len(stream.encode()) + sum(len(k) + len(v) for k, v in fields.items())
    size += (len(fields) * 2 + 6) * _FRAMING  # XADD, the stream, MAXLEN ~ N, *
    if size > limits.max_query:
        return (
            f"the XADD command would be {size} bytes, over the server's "
            f"client-query-buffer-limit of {limits.max_query} bytes"
        )
    return None


def error_code(error: Exception) -> str:
    """The error's code (``WRONGTYPE``, ``OOM``...): redis-py strips the codes it maps to
    an exception class from the message and keeps them as ``status_code``."""
    code = getattr(error, "status_code", None)
    return str(code) if code else str(error).split(" ", 1)[0]


def server_state(error: Exception) -> bool:
    """Whether a command's error says the server cannot take writes now (not this entry)."""
    return error_code(error) in SERVER_STATES


def command_error(error: Exception) -> str:
    """A command's error as Redis said it, its code first."""
    code, text = error_code(error), str(error)
    return text if text.startswith(code) else f"{code} {text}"


def describe(exc: BaseException) -> str:
    """Name the exception type too: several redis-py errors have empty or generic texts."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
