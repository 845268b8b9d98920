"""What an intermediary's server counts while it serves, for its metrics
(:mod:`.metrics` reads them at each scrape, from its own thread: plain integers, written on
the event loop only).

Refusals are counted by reason, one label value each, named in :data:`REFUSALS` with the
Gatekeeper's own (:attr:`.access.Gatekeeper.refusals`), so the metrics list every reason
from the start, at 0 until it happens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: Every reason a subscriber, a handshake or a request is refused for, and what it means.
REFUSALS = {
    "bad_credentials": "malformed credentials, an unknown token, a wrong user or password",
    "anonymous": "no credentials, where anonymous subscribers are not served",
    "login_throttled": "a handshake from an address that failed to log in too often",
    "too_many_connections": "the server's max_connections reached",
    "too_many_from_address": (
        "the client address's max_connections_per_address reached (at TCP accept, or at the "
        "WebSocket handshake)"
    ),
    "tls_handshake_timeout": "a connection to the TLS port that sent nothing in time",
    "not_tls": "a connection to the TLS port whose first byte is plaintext (closed at once)",
    "not_granted": "a subscription its identity's grant does not allow",
    "rate_limited": "a request over the connection's rate",
    "too_large": "a message over max_request_bytes (closed with 1009)",
    "malformed": "a request that is not a JSON object, or a frame the WebSocket refuses",
    "too_deep": "a request's JSON nested too deeply",
    "invalid": "a well-formed request with a bad value (an unknown op or field, a bad region)",
}


@dataclass
class ServingCounters:
    """Totals since the server started."""

    #: Refusals by reason (the transport's; the Gatekeeper counts its own).
    refusals: Counter[str] = field(default_factory=Counter)
    #: Binary frames sent to subscribers.
    frames_sent: int = 0
    #: JSON messages sent (events, views, notices, replies, hellos left out).
    messages_sent: int = 0
    #: Frames and view messages replaced by a newer one before they were sent (the
    #: subscriber did not take them in time).
    replaced: int = 0
    #: Subscribers the server disconnected for being too slow.
    subscribers_dropped: int = 0


@dataclass(frozen=True)
class Disconnect:
    """A connection the server closed, and why."""

    subscriber: int
    code: int
    reason: str
