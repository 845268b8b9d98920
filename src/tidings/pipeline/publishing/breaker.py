"""A circuit breaker per target, so a target that is down costs no retries and no time.

While a target is known to be down, the relay does not send to it: its events wait (HELD)
with their retry counts unchanged. After a pause a single call goes through as a probe; if
it succeeds the target is up again and every waiting key resumes on the same run. The pause
grows while probes keep failing, up to a bound, so a long outage costs one failing call
every few seconds, and a target's return is noticed within that bound.

A target is taken as down when a call says so (:class:`~tidings.errors.TargetUnavailable`:
nothing could be sent) or when calls for several different keys fail in a row with no
success between them. One poison event failing again and again is one key: it does not
trip the breaker, so it cannot make its innocent neighbours wait.

State lives in the process (Spark reuses its Python workers, so it outlives a task); each
worker process learns about an outage from its own first failing call.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable

from tidings.targets.base import Target

#: Failed calls in a row, for at least two different keys, that mark a target as down.
FAILED_CALLS_TO_OPEN = 3
FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 2.0  # below the carry-over pause, so a carry-over finds a probe due


class CircuitBreaker:
    """Closed (send), open (wait until the pause is over), half-open (one probe)."""

    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._failed_keys: set[str] = set()
        self._open_until: float | None = None
        self._pause = FIRST_PAUSE_S
        self._probing = False
        self.cause = ""

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def allows(self) -> bool:
        """May a call go to the target now? In the half-open state only one (the probe)."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._probing or self._clock() < self._open_until:
                return False
            self._probing = True
            return True

    def succeeded(self) -> None:
        """A call was confirmed (at least in part): the target is up."""
        with self._lock:
            self._failures, self._failed_keys = 0, set()
            self._open_until, self._pause, self._probing = None, FIRST_PAUSE_S, False

    def failed(self, cause: str, keys: set[str], *, unavailable: bool = False) -> None:
        """A call failed entirely, for events of ``keys``; ``unavailable``: nothing was sent."""
        with self._lock:
            self._failures += 1
            self._failed_keys |= keys
            many_keys = self._failures >= FAILED_CALLS_TO_OPEN and len(self._failed_keys) > 1
            if unavailable or many_keys or self._probing:
                if self._open_until is not None:
                    self._pause = min(self._pause * 2, MAX_PAUSE_S)
                self._open_until = self._clock() + self._pause
                self._probing = False
                self.cause = cause

    def reason(self) -> str:
        return f"target {self.name!r} is unavailable, waiting for it: {self.cause}"


_breakers: weakref.WeakKeyDictionary[Target, CircuitBreaker] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def breaker_for(target: Target) -> CircuitBreaker:
    """The breaker of ``target``: one per target object, so per name and configuration."""
    with _lock:
        breaker = _breakers.get(target)
        if breaker is None:
            breaker = _breakers[target] = CircuitBreaker(target.name)
        return breaker
