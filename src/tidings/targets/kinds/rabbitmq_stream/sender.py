"""This process's producer on one stream: the producer reference it holds, the publishing
ids it hands out, and the reconciliation of references whose sender is gone.

The rules that make the stream exactly-once (the design notes, docs/design/rabbitmq-streams.md,
say why they suffice):

1. A reference is used by one sender at a time: a sender takes a slot of the pool in the
   outbox (:class:`~tidings.outbox.stream_ids.StreamIds`) and renews its lease with every
   send; it sends only right after a renewal.
2. Taking a slot, the sender asks the broker for the reference's last stored id ``L``, drops
   the recorded assignments above ``L`` (never stored) and numbers from ``L + 1``.
3. Before a batch is sent, each event's id is recorded (one write, with the renewal).
4. An event that already has an assignment is not numbered again blindly: under this
   sender's own reference, an id up to ``L`` is stored and the event is confirmed without
   sending; under another reference, that reference is reconciled first (taken once its
   lease has expired, so that whatever its last sender sent has been stored or dropped),
   then the same rule applies.
5. A sender that cannot know the fate of what it sent (no confirm in time, the connection
   dropped) abandons its reference (it stays leased for ``producer_lease``) and takes
   another one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tidings.errors import TargetUnavailable
from tidings.outbox.stream_ids import Assignment, StreamIds, reference
from tidings.targets.kinds.rabbitmq_stream.connection import StreamConnection

#: Publish-error codes that say the broker dropped the stream and its publishers: the
#: stream does not exist, the publisher does not exist.
STREAM_GONE = frozenset({2, 18})
#: How often (seconds) a sender drops the assignments of events the relay has recorded as
#: PUBLISHED (or housekeeping deleted), so that the table holds only the events in flight.
FORGET_EVERY = 60.0


@dataclass
class Item:
    """One event of a call going to this sender's stream: its index in the call, its id and
    its message's data."""

    index: int
    event_id: str
    data: bytes


@dataclass
class Sent:
    """What became of one batch: per call index, ``True`` confirmed, a response code (an
    int) refused by the broker, or ``None`` no answer in time; and the reference it went
    under."""

    answers: dict[int, bool | int | None]
    reference: str


class StreamSender:
    """One stream's producer in this process; one batch at a time (``lock``)."""

    def __init__(
        self,
        target: str,
        stream: str,
        ids: StreamIds,
        holder: str,
        pool: int,
        lease: float,
        confirm_timeout: float,
    ) -> None:
        self.target = target
        self.stream = stream
        self.ids = ids
        self.holder = holder
        self.pool = pool
        self.lease = lease
        self.confirm_timeout = confirm_timeout
        self.lock = asyncio.Lock()
        self.slot: int | None = None
        self.publisher_id: int | None = None
        self.last_stored = 0  # the highest id known stored under the slot's reference
        self.next_id = 1
        self._forget_at = 0.0  # when the assignments of published events are dropped next
        #: Messages were sent whose answers did not all come: their fate is unknown.
        self.in_flight = False

    async def send(
        self, connection: StreamConnection, items: Sequence[Item], peers: dict[str, StreamSender]
    ) -> Sent:
        """Send ``items`` (in call order) exactly once; what the broker answered per item.
        ``peers`` are this process's senders of other streams (an event may have been sent to
        one of them, when its stream's template or the configuration changed)."""
        await self._hold(connection)
        answers: dict[int, bool | int | None] = {}
        known = await asyncio.to_thread(self.ids.assignments, [i.event_id for i in items])
        fresh: list[Item] = []
        last: dict[tuple[str, int], int] = {}  # per reference, reconciled once per batch
        for item in items:
            found = known.get(item.event_id)
            if found is None:
                fresh.append(item)
                continue
            where = (found.stream, found.slot)
            if where not in last:
                last[where] = await self._last_stored(connection, found, peers)
            if found.publishing_id <= last[where]:
                answers[item.index] = True  # stored before: confirmed without sending
            else:
                fresh.append(item)  # its assignment was dropped: never stored
        if fresh:
            answers.update(await self._send_fresh(connection, fresh))
        return Sent(answers, reference(self.target, self.slot if self.slot is not None else -1))

    def abandon(self) -> None:
        """Give up the slot with messages perhaps in flight (blocking: the outbox)."""
        if self.slot is not None:
            self.ids.abandon(self.stream, self.slot, self.holder, self.lease)
        self.slot = self.publisher_id = None
        self.in_flight = False

    def release(self) -> None:
        """Give the slot back cleanly: nothing is in flight (blocking: the outbox)."""
        if self.slot is not None:
            self.ids.release(self.stream, self.slot, self.holder)
        self.slot = self.publisher_id = None

    # -- the reference ---------------------------------------------------------------------

    async def _hold(self, connection: StreamConnection) -> None:
        """Hold a slot, reconciled, with its publisher declared on ``connection``."""
        if self.slot is None:
            slot = await self._take(self.stream, None)
            try:
                last = await self._reconcile(connection, self.stream, slot)
            except BaseException:
                await asyncio.to_thread(self.ids.release, self.stream, slot, self.holder)
                raise
            self.slot, self.last_stored, self.next_id = slot, last, last + 1
            self.publisher_id = None
        if time.monotonic() >= self._forget_at:
            await asyncio.to_thread(self.ids.forget_published)
            self._forget_at = time.monotonic() + FORGET_EVERY
        if self.publisher_id is None:
            self.publisher_id = await connection.declare(
                self.stream, reference(self.target, self.slot)
            )

    async def _take(self, stream: str, slot: int | None) -> int:
        """Take a free slot of ``stream`` (``slot``: that one), waiting at most
        ``producer_lease`` for one; TargetUnavailable if none comes free."""
        deadline = time.monotonic() + self.lease + 1
        while True:
            got = await asyncio.to_thread(
                self.ids.take, stream, self.holder, self.lease, self.pool, slot
            )
            if isinstance(got, int):
                return got
            if time.monotonic() + got > deadline:
                which = (
                    f"producer reference {reference(self.target, slot)!r}"
                    if slot is not None
                    else f"all {self.pool} producer references"
                )
                raise TargetUnavailable(
                    f"{which} of stream {stream!r} held by other senders (or cooling down "
                    f"after one died) for {got:.1f}s more"
                )
            await asyncio.sleep(got)

    async def _reconcile(self, connection: StreamConnection, stream: str, slot: int) -> int:
        """The broker's last stored id ``L`` of the (held) slot's reference; assignments above
        it dropped."""
        from rstream.exceptions import StreamDoesNotExist

        try:
            last = await connection.last_stored(stream, reference(self.target, slot))
        except StreamDoesNotExist:
            last = 0  # a deleted stream: nothing of it is stored any more
        await asyncio.to_thread(self.ids.reconcile, stream, slot, last)
        return last

    async def _last_stored(
        self, connection: StreamConnection, found: Assignment, peers: dict[str, StreamSender]
    ) -> int:
        """The last stored id of the reference an event was sent under, that reference
        reconciled first if another sender used it (its assignments above it dropped)."""
        holder = self if found.stream == self.stream else peers.get(found.stream)
        if holder is not None and holder.slot == found.slot:
            return holder.last_stored
        await self._take(found.stream, found.slot)
        try:
            return await self._reconcile(connection, found.stream, found.slot)
        finally:
            await asyncio.to_thread(self.ids.release, found.stream, found.slot, self.holder)

    # -- a batch ---------------------------------------------------------------------------

    async def _send_fresh(
        self, connection: StreamConnection, items: Sequence[Item]
    ) -> dict[int, bool | int | None]:
        """Number ``items`` from ``next_id``, record that, send them and wait for answers."""
        assert self.slot is not None and self.publisher_id is not None
        numbered = [(item, self.next_id + n) for n, item in enumerate(items)]
        # The lease runs from the renewal in ``assign``; taken before it, so on the safe side.
        # Sending and confirms end within confirm_timeout of it, shorter than the lease, so
        # that a batch that is not through can be abandoned while the lease is still ours.
        renewed = time.monotonic()
        recorded = await asyncio.to_thread(
            self.ids.assign,
            self.stream,
            self.slot,
            self.holder,
            self.lease,
            [(item.event_id, pid) for item, pid in numbered],
        )
        if not recorded:  # the lease lapsed and another sender took the slot: take one again
            self.slot = self.publisher_id = None
            await self._hold(connection)
            return await self._send_fresh(connection, items)
        self.next_id += len(numbered)
        self.in_flight = True  # until every answer is in: if not, the caller abandons
        answers = await connection.publish(
            self.publisher_id,
            [(p, i.data) for i, p in numbered],
            renewed + self.confirm_timeout,
        )
        refused = [item.event_id for item, pid in numbered if answers.get(pid, 0) != 0]
        if refused:  # not stored: numbered afresh when sent again
            await asyncio.to_thread(self.ids.forget, refused)
        stored = [pid for pid in answers if answers[pid] == 0]
        if stored:
            self.last_stored = max(self.last_stored, *stored)
        self.in_flight = len(answers) < len(numbered)
        if not self.in_flight and any(code in STREAM_GONE for code in answers.values()):
            # The stream was deleted (and perhaps created again): the broker dropped the
            # publisher and the reference's last id with it. Give the slot back (nothing is
            # in flight); the next batch takes one, reconciled against the stream as it is.
            connection.forget_publisher(self.stream, reference(self.target, self.slot))
            await asyncio.to_thread(self.release)
        return {
            item.index: (True if answers[pid] == 0 else answers[pid]) if pid in answers else None
            for item, pid in numbered
        }
