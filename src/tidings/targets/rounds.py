"""One publish call's events in rounds: round *n* holds the *n*-th event of every ordering
key still going, so a key's events are confirmed one after another.

Why rounds: a target whose broker answers each message on its own (Redis ``XADD``, MQTT's
``PUBACK``) can send a whole round at once, pipelined, and still keep each key's order
across a failure: an event is sent only once the one before it of its key is confirmed, and
after a failure the rest of that key's run is not sent (it is answered :func:`not_sent`,
which the relay does not charge; the failed event is the one blamed). With one event per
key per call, the usual case, a call is one round.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from tidings.events.outbox import OutboxEvent


def not_sent(culprit: OutboxEvent) -> str:
    return f"not sent: event seq {culprit.seq} of its key failed before it in this call"


class Rounds:
    """The state of one call: which events are still to go, each event's result, and which
    were confirmed (for :class:`~tidings.errors.TargetCallFailed`'s ``confirmed``)."""

    def __init__(self, events: Sequence[OutboxEvent]) -> None:
        self.events = events
        self.results: list[str | None] = [None] * len(events)
        self.confirmed = [False] * len(events)
        runs: dict[str, deque[int]] = {}
        for index, event in enumerate(events):
            runs.setdefault(event.ordering_key, deque()).append(index)
        self._runs = list(runs.values())
        self._run_of: dict[int, deque[int]] = {}

    def next_round(self) -> list[int]:
        """The indexes of the next event of every key still going, in call order; empty
        when the call is done."""
        self._runs = [run for run in self._runs if run]
        chosen = []
        for run in self._runs:
            index = run.popleft()
            self._run_of[index] = run
            chosen.append(index)
        return sorted(chosen)

    def confirm(self, index: int) -> None:
        self.confirmed[index] = True

    def fail(self, index: int, error: str) -> None:
        """Event ``index`` failed with ``error``; the rest of its key's run is not sent."""
        self.results[index] = error
        run = self._run_of.get(index)
        while run:
            self.results[run.popleft()] = not_sent(self.events[index])
