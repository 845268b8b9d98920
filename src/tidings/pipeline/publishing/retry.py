"""How often, and after which pauses, the relay tries an event again at a target.

A failed try is recorded in the event's delivery state at that target (``failures`` and,
while tries are left, ``retry_at``: the epoch second of the next try). Nothing sleeps on it:
the publishing run goes on with every other lane and sends the retry once it is due (a
short wait at the end of a run, :data:`IN_RUN_WAIT_S`, saves a carry-over); a later retry
is made by the relay's carry-over (:mod:`tidings.pipeline.source.datasource`). After the
last try the event is FAILED at that target and its key's later events wait for it there; the relay
stops, a replay may try again below ``replay.retry_count_threshold``, and an operator can
resubmit or park it (:mod:`tidings.outbox.incomplete`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from tidings.config import RetryConfig
from tidings.errors import UsageError

#: A run whose only work left is a retry due within this many seconds waits for it instead
#: of leaving it to the next carry-over (which comes after 0.5 s at the soonest).
IN_RUN_WAIT_S = 0.5


@dataclass(frozen=True)
class RetryPolicy:
    """Tries per target and the pause before each retry.

    Either an explicit schedule (``delays``: one pause per retry, the patent's
    ``[10ms, 25ms, 40ms]``), or exponential: ``initial`` times ``multiplier`` per failure,
    capped at ``maximum``, each pause spread by ``jitter`` (0.2 = ±20 %) so that keys that
    failed together do not retry together.
    """

    attempts: int
    initial: float = 0.0
    multiplier: float = 1.0
    maximum: float = 0.0
    jitter: float = 0.0
    delays: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UsageError(f"attempts must be at least 1, got {self.attempts}")

    @classmethod
    def of(cls, retry: RetryPolicy | RetryConfig | Sequence[float]) -> RetryPolicy:
        """The policy of a configuration, or of an explicit schedule of pauses."""
        if isinstance(retry, RetryPolicy):
            return retry
        if isinstance(retry, RetryConfig):
            if retry.backoff is not None:
                return cls.of([d.total_seconds() for d in retry.backoff])
            return cls(
                attempts=retry.tries,
                initial=retry.initial_backoff.total_seconds(),
                multiplier=retry.multiplier,
                maximum=retry.max_backoff.total_seconds(),
                jitter=retry.jitter,
            )
        delays = tuple(float(d) for d in retry)
        return cls(attempts=len(delays) + 1, delays=delays)

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failed try (1 = after the first)."""
        if self.delays is not None:
            return self.delays[min(failures, len(self.delays)) - 1] if self.delays else 0.0
        try:
            base = min(self.maximum, self.initial * self.multiplier ** (failures - 1))
        except OverflowError:  # far past the cap
            base = self.maximum
        return base * (1 + self.jitter * random.uniform(-1.0, 1.0))
