"""One subscriber's connection to an intermediary's server, and how what is offered to it
leaves (:mod:`.transport` says why it is built so).

Slow subscribers never hold the others ([146]): each connection has one outgoing slot
holding the latest round's frames; a writer task per connection empties it
(:meth:`Connection.write`). A round sends to an idle connection itself
(:meth:`Connection.send_now`), and leaves a send that must wait for the transport to the
writer, which finishes it (:func:`finish`) before anything else. Events (and status
messages) are not queued per connection: each is appended once to the server's
:class:`~.ring.EventRing`, and the writer walks the ring from the connection's cursor,
sending what is for it, one message at a time and only as fast as its transport takes them;
a writer that waits for its transport costs nothing per event. View messages wait per key
(latest wins); messages the server pushes unasked (notices) go out after the frames already
offered. Requests are limited by a token bucket per connection
(:meth:`Connection.take_token`).

What waits is bounded by the ring (:func:`catch_up`): a connection whose cursor falls off
the ring's start, and which loses a message meant for it, is closed as too slow. So a
thousand never-readers of a busy type hold one copy of each event, in one ring, and cost
the loop O(1) each per tick.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket

from tidings.intermediary.node.intermediary import Served
from tidings.intermediary.serving.counters import ServingCounters
from tidings.intermediary.serving.envelope import envelope
from tidings.intermediary.serving.ring import EventRing
from tidings.intermediary.views.grants import NOTHING, Grant
from tidings.intermediary.views.messages import keyed

#: Messages a writer sends from the ring before it lets the loop serve the others: a send
#: the transport takes at once never yields, and a writer catching up (many subscribers
#: woken by one busy tick, each filling its socket's buffers) would hold the loop meanwhile.
YIELD_EVERY = 8


@dataclass
class Connection:
    """A subscriber's connection: its socket, the grant of the identity it proved at the
    handshake, what waits to be sent, and its request tokens."""

    id: int
    websocket: WebSocket
    grant: Grant = NOTHING
    slot: list[Served] | None = None
    #: The server's ring of events and status messages, and the next entry to look at.
    ring: EventRing = field(default_factory=EventRing)
    cursor: int = 0
    #: The latest view message per key not sent yet (a view is a latest value).
    views: dict[str, str] = field(default_factory=dict)
    #: The bytes of :attr:`views`.
    view_bytes: int = 0
    notices: list[str] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    kicked: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    replaced: int = 0
    #: The writer waits for work with nothing pending: a round may send to it directly.
    idle: bool = False
    #: A direct send that must wait for the transport (its coroutine and what it waits
    #: for), or failed: the writer finishes it, or raises it, before anything else.
    pending: tuple[Coroutine[Any, Any, None], Any] | None = None
    failure: BaseException | None = None
    tokens: float = 0.0
    refilled: float = 0.0
    #: The server's totals (frames and messages sent, replaced); its own by default.
    counters: ServingCounters = field(default_factory=ServingCounters)

    @property
    def queued_bytes(self) -> int:
        """What this subscriber's backlog weighs: the ring from its cursor (every message
        there, its own or not: an upper bound) and its pending views."""
        return self.ring.behind(self.cursor) + self.view_bytes

    def queue(self, message: dict[str, Any]) -> None:
        """A view message replaces the one of its key not sent yet (counted in
        :attr:`replaced`, unless it says ``unchanged``: as the pending one)."""
        if (key := message["key"]) not in self.views or not message.get("unchanged"):
            if key in self.views:
                self.replaced += 1
                self.counters.replaced += 1
                self.view_bytes -= len(self.views[key])
            text = json.dumps(message, default=str)
            self.views[key] = text
            self.view_bytes += len(text)
        self.wake.set()

    def drop_queued(self) -> None:
        """Forget every message waiting (the connection is being closed)."""
        self.cursor = self.ring.end
        self.views.clear()
        self.view_bytes = 0

    def send_now(self) -> bool:
        """Send the slot from here when the writer is idle: a send that does not have to
        wait for the transport completes in one step, with no writer task to wake (that
        wake cost as much as the rest of the send, per frame). One that has to wait, or
        fails, is left to the writer (:func:`finish`). True if all of it was sent."""
        items, self.slot = self.slot or [], None
        for sent, served in enumerate(items):
            self.counters.frames_sent += 1
            send = self.websocket.send_bytes(envelope(served.key, served.frame.data))
            try:
                waiting_for = send.send(None)
            except StopIteration:
                continue
            except BaseException as exc:  # the writer raises it, closing the connection
                self.failure = exc
            else:
                self.pending = (send, waiting_for)
            self.slot = items[sent + 1 :] or None  # the rest, after the pending one
            self.idle = False
            return False
        return True

    async def write(self, ready: Callable[[], None]) -> None:
        """The writer: send whatever waits, in order, until cancelled; ``ready`` is called
        each time the slot is empty again (the channel can take a frame)."""
        while True:
            self.idle = not (self.cursor < self.ring.end or self.views or self.slot or self.notices)
            await self.wake.wait()
            self.idle = False
            self.wake.clear()
            if self.failure is not None:
                raise self.failure
            if self.pending is not None:
                pending, self.pending = self.pending, None
                await finish(*pending)
            counters = self.counters
            ring = self.ring
            sent = 0
            while self.cursor < ring.end:  # a send that waits for the transport waits here
                entry = ring.entries[self.cursor]
                self.cursor += 1
                texts = (entry.body,) if entry.route is None else entry.route.get(self.id, ())
                for text in texts:
                    counters.messages_sent += 1
                    sent += 1
                    body = text if entry.route is None else keyed(entry.body, text)
                    await self.websocket.send_text(body)
                if sent >= YIELD_EVERY:  # a send the transport takes at once does not yield
                    sent = 0
                    await asyncio.sleep(0)
            views, self.views = self.views, {}
            self.view_bytes = 0
            for text in views.values():
                counters.messages_sent += 1
                await self.websocket.send_text(text)
            items, self.slot = self.slot, None
            notices, self.notices = self.notices, []
            for served in items or ():
                counters.frames_sent += 1
                await self.websocket.send_bytes(envelope(served.key, served.frame.data))
            for notice in notices:
                counters.messages_sent += 1
                await self.websocket.send_text(notice)
            if self.slot is None:
                ready()

    def take_token(self, now: float, burst: int, per_s: float) -> bool:
        """Whether a request may be handled now: a bucket of ``burst`` tokens refilled at
        ``per_s``, one token a request."""
        self.tokens = min(float(burst), self.tokens + (now - self.refilled) * per_s)
        self.refilled = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def catch_up(connections: Mapping[Any, Connection], ring: EventRing) -> list[tuple[Any, str]]:
    """End a tick that appended to ``ring``: trim it (:meth:`~.ring.EventRing.trim`), and
    return, with the reason, to close, each connection whose cursor was in what was dropped
    and that lost a message meant for it (what waits for it is forgotten); the others' cursors
    move to the ring's start, and every connection with something new is woken; what every
    connection has passed is forgotten. O(1) per connection, plus, for one whose cursor was
    dropped, the dropped entries it skips."""
    if ring.tick_start == ring.end:  # nothing appended since the last tick
        return []
    first = ring.start
    dropped, reason = ring.trim()
    over: list[tuple[Any, str]] = []
    lowest = ring.end
    for subscriber, conn in connections.items():
        if conn.cursor < ring.start:
            skipped = dropped[conn.cursor - first :]
            if conn.kicked.is_set() or any(
                e.route is None or subscriber in e.route for e in skipped
            ):
                if not conn.kicked.is_set():
                    over.append((subscriber, reason))
                conn.drop_queued()
                continue
            conn.cursor = ring.start
        lowest = min(lowest, conn.cursor)
        if conn.cursor < ring.end:
            conn.wake.set()
    ring.forget(lowest)
    return over


async def finish(send: Coroutine[Any, Any, None], waiting_for: Any) -> None:
    """Run ``send``, which stopped at its first step waiting for the future
    ``waiting_for``, to its end in this task: what a task does with a coroutine it runs."""
    try:
        while True:
            try:
                if waiting_for is None:  # a bare yield: let the loop run once
                    await asyncio.sleep(0)
                else:
                    # As a task does with a future its coroutine yields: it is the one
                    # waiting now (a future still marked blocking refuses another await).
                    waiting_for._asyncio_future_blocking = False
                    await waiting_for
            except BaseException as exc:  # e.g. this writer cancelled: so is the send
                waiting_for = send.throw(exc)
            else:
                waiting_for = send.send(None)
    except StopIteration:
        return
    finally:
        send.close()
