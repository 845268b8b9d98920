"""Notifications: each stored batch to the clients subscribed to it, in position order.

Encoding a batch is the costly part (about 10 µs an event), and a batch can be large: one
client's register of 100,000 events is one. Encoded on the event loop, such a batch held
every other client for a second. A batch of up to :data:`INLINE_EVENTS` is still encoded
and sent at once, on the loop (the common case, and the fastest); a larger one is encoded
in a worker thread while the loop serves others. Batches queue behind one being encoded,
so that every client still receives them in position order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from tidings.events.matching import TypeMatcher
from tidings.events.model import EventType, StoredEvent
from tidings.wire import codec

log = logging.getLogger(__name__)

#: Largest batch (or register reply, see the Eventer) encoded on the event loop: ~3 ms.
INLINE_EVENTS = 256

K = TypeVar("K")


class NotifyBatch:
    """One stored batch as ``MsgNotify`` bodies for many clients.

    Each event becomes its wire record once, and each distinct selection of events is
    encoded once, so that clients with the same subscription (or all clients, when the whole
    batch matches them) share one encoded body.
    """

    def __init__(self, events: Sequence[StoredEvent]) -> None:
        self._events = events
        #: Positions in the batch of the events of each type (a batch repeats few types).
        self._by_type: dict[EventType, list[int]] = {}
        for index, event in enumerate(events):
            self._by_type.setdefault(event.type, []).append(index)
        #: Each event's encoding, made when a selection first holds it (an event that
        #: cannot be encoded fails only the subscribers that selected it).
        self._encoded: list[bytes | None] = [None] * len(events)
        self._bodies: dict[tuple[int, ...], bytes] = {}

    def select(self, matcher: TypeMatcher) -> tuple[int, ...]:
        """Positions of the events ``matcher`` accepts, in batch order."""
        matching = [t for t in self._by_type if matcher.matches(t)]
        if len(matching) == len(self._by_type):
            return tuple(range(len(self._events)))
        if len(matching) == 1:
            return tuple(self._by_type[matching[0]])
        return tuple(sorted(i for t in matching for i in self._by_type[t]))

    def body(self, selection: tuple[int, ...]) -> bytes:
        """The encoded ``MsgNotify`` of the events at ``selection``."""
        body = self._bodies.get(selection)
        if body is None:
            parts = [codec.encode_integer(len(selection))]
            for index in selection:
                encoded = self._encoded[index]
                if encoded is None:
                    encoded = self._encoded[index] = codec.encode_event(self._events[index])
                parts.append(encoded)
            body = self._bodies[selection] = b"".join(parts)
        return body


def notify_bodies(
    events: Sequence[StoredEvent], subscribers: Sequence[tuple[K, TypeMatcher]]
) -> list[tuple[K, bytes]]:
    """The ``MsgNotify`` body each subscriber gets of ``events`` (none if nothing matches)."""
    batch = NotifyBatch(events)
    bodies = []
    for subscriber, matcher in subscribers:
        selection = batch.select(matcher)
        if selection:
            bodies.append((subscriber, batch.body(selection)))
    return bodies


class Notifier(Generic[K]):
    """Encodes stored batches for their subscribers and hands the bodies to ``send``, batch
    after batch in the order :meth:`notify` was called. ``send`` must not block.

    A subscriber gets every batch it subscribed to, in order, or is handed to ``drop`` (to
    be disconnected; it can catch up with a query): a batch that cannot be encoded is never
    skipped silently.
    """

    def __init__(self, send: Callable[[K, bytes], None], drop: Callable[[K, str], None]) -> None:
        self._send = send
        self._drop = drop
        self._pending: deque[tuple[Sequence[StoredEvent], list[tuple[K, TypeMatcher]]]] = deque()
        self._task: asyncio.Task[None] | None = None

    def notify(
        self, events: Sequence[StoredEvent], subscribers: list[tuple[K, TypeMatcher]]
    ) -> None:
        """Notify ``subscribers`` (each with the matcher it had when the batch was stored)."""
        if not events or not subscribers:
            return
        if not self._pending and len(events) <= INLINE_EVENTS:
            try:
                bodies = notify_bodies(events, subscribers)
            except Exception as exc:
                self._fail([subscribers], exc)
                return
            self._deliver(bodies)
            return
        self._pending.append((events, subscribers))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def aclose(self) -> None:
        """Stop; batches not encoded yet are not sent (their clients are being closed)."""
        self._pending.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _drain(self) -> None:
        try:
            while self._pending:
                events, subscribers = self._pending[0]
                if len(events) > INLINE_EVENTS:
                    bodies = await asyncio.to_thread(notify_bodies, events, subscribers)
                else:
                    bodies = notify_bodies(events, subscribers)
                self._pending.popleft()
                self._deliver(bodies)
        except Exception as exc:
            pending = [subscribers for _, subscribers in self._pending]
            self._pending.clear()
            self._fail(pending, exc)
        finally:
            self._task = None

    def _fail(self, batches: list[list[tuple[K, TypeMatcher]]], exc: Exception) -> None:
        """A bug, not a client's doing: the batches' subscribers would miss them."""
        log.error(
            "eventer: cannot encode notifications: %s: %s", type(exc).__name__, exc, exc_info=exc
        )
        for subscriber in {subscriber for batch in batches for subscriber, _ in batch}:
            self._drop(subscriber, f"notification failed: {type(exc).__name__}: {exc}")

    def _deliver(self, bodies: list[tuple[K, bytes]]) -> None:
        for subscriber, body in bodies:
            self._send(subscriber, body)
