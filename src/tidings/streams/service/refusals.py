"""A stream's refusals, counted for its metrics and logged without flooding the log.

Every refused request counts under its user and reason: ``authentication`` (a wrong or
missing password: no user is known, so the user is empty, and the names a caller claims
never become labels, which would let it grow the metrics without bound), or the permission
it lacked (``stream``, ``component``, ``type``, ``add_event``, ``add_event_data``: see
:class:`~tidings.errors.StreamRefused`), or ``slow_request_head``: a connection closed for
sending no whole request head in time, counted under the first stream of its port
(:mod:`.slow_clients`). The first refusal of each kind (user, reason and
message) is logged as a warning; repeats only count, so a client that retries a refused
call, or floods wrong passwords, costs one log line per cause.
"""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger(__name__)

AUTHENTICATION = "authentication"
#: A connection closed for sending no whole request head in time (:mod:`.slow_clients`).
SLOW_REQUEST_HEAD = "slow_request_head"
#: The distinct refusals logged per stream, at most (beyond them, refusals only count).
MAX_LOGGED = 1000


class Refusals:
    """One stream's refusals; see the module docstring."""

    def __init__(self, stream: str) -> None:
        self._stream = stream
        #: (user, reason) -> refusals so far.
        self.counts: Counter[tuple[str, str]] = Counter()
        self._logged: set[tuple[str, str, str]] = set()

    def record(self, user: str, reason: str, description: str) -> None:
        """Count a refusal, and log it if it is the first of its kind."""
        self.counts[(user, reason)] += 1
        key = (user, reason, description)
        if key in self._logged or len(self._logged) >= MAX_LOGGED:
            return
        self._logged.add(key)
        log.warning(
            "stream request refused (repeats are counted in the stream's metrics, not logged)",
            extra={"stream": self._stream, "user": user, "reason": reason, "error": description},
        )
