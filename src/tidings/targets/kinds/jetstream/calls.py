"""One publish call of the JetStream target: its events as runs per ordering key, in flight.

The target sends the first event of every key at once and each later one as soon as the
one before it is acknowledged (:class:`Call` keeps which are in flight, which acks arrived
and every event's result); an event after one that failed is not sent (:func:`not_sent`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidings.events.outbox import OutboxEvent
from tidings.targets.kinds.jetstream.messages import AckInbox

if TYPE_CHECKING:  # nats-py is loaded only by a process that connects
    from nats.aio.msg import Msg


def not_sent(culprit: OutboxEvent) -> str:
    return f"not sent: event seq {culprit.seq} of its key failed before it in this call"


class Call:
    """One publish call: its events as runs per ordering key (each in call order), the
    events in flight with their runs, the acks that arrived, and every event's result."""

    def __init__(
        self, events: Sequence[OutboxEvent], runs: list[deque[int]], inbox: AckInbox
    ) -> None:
        self.events = events
        self.runs = runs
        self.inbox = inbox
        self.results: list[str | None] = [None] * len(events)
        self.in_flight: dict[int, tuple[str, deque[int]]] = {}  # index -> (subject, run)
        self.acks: list[asyncio.Future[Msg]] = []
        self.replies: list[str] = []
        self.arrived: deque[tuple[int, asyncio.Future[Msg]]] = deque()
        self.settled = 0  # acks taken from ``arrived`` so far
        self._waiter: asyncio.Future[bool] | None = None

    def ack_arrived(self, index: int, ack: asyncio.Future[Msg]) -> None:
        self.arrived.append((index, ack))
        self.wake()

    def wake(self) -> None:
        """End the current :meth:`next_wake` (an ack arrived, or the connection is lost)."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(True)

    async def next_wake(self, timeout: float) -> bool:
        """Wait for :meth:`wake` (True) or ``timeout`` seconds (False).

        A bare future with a timer rather than ``asyncio.wait_for``: on Python 3.11
        ``wait_for`` returns normally when a cancellation lands as the awaited event fires,
        and a call the caller gave up on would go on sending.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiter = waiter
        timer = loop.call_later(timeout, _resolve, waiter, False)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiter = None


def key_runs(events: Sequence[OutboxEvent]) -> list[deque[int]]:
    """The indexes of ``events`` per ordering key, each run in call order."""
    runs: dict[str, deque[int]] = {}
    for index, event in enumerate(events):
        runs.setdefault(event.ordering_key, deque()).append(index)
    return list(runs.values())


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)
