"""What an endpoint's answer means for the event it was about.

* 2xx: confirmed;
* 408, 429 and 5xx: the endpoint cannot take it now; sent again within the call after the
  answer's ``Retry-After`` (seconds or an HTTP date) or the target's backoff, whichever is
  longer, a few times, then the event fails (the relay's retry policy takes over);
* any other answer (4xx, and 1xx/3xx, since redirects are not followed: a moved endpoint is
  a configuration to fix, not a place to post events to unasked): the endpoint refused
  this event, which fails alone, its error naming the status and the start of the body;
* no answer at all (refused connection, timeout, connection lost): the endpoint is
  unavailable; no event is to blame.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

#: The most characters of an answer's body an error quotes.
BODY_CHARS = 200


def confirmed(status: int) -> bool:
    return 200 <= status < 300


def retried(status: int) -> bool:
    """An answer that asks to try again later (the endpoint, not the event, is the cause)."""
    return status in (408, 429) or 500 <= status < 600


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait that a ``Retry-After`` header asks for (0 for a date in the past);
    None if there is none or it is neither a number of seconds nor an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT
        return None
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def body_piece(text: str) -> str:
    """The start of an answer's body for an error: at most :data:`BODY_CHARS`, one line."""
    flat = " ".join(text.split())
    if len(flat) <= BODY_CHARS:
        return flat
    return f"{flat[:BODY_CHARS]}... ({len(text)} characters)"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One event's end in a call: ``error`` None if confirmed; ``unreachable`` if no answer
    came (the endpoint is down, the event is not to blame)."""

    error: str | None = None
    unreachable: bool = False


CONFIRMED = Outcome()
