"""One subscriber's connection to an intermediary's server, and how what is offered to it
leaves (:mod:`.transport` says why it is built so).

Slow subscribers never hold the others ([146]): each connection has one outgoing slot
holding the latest round's frames; a writer task per connection empties it
(:meth:`Connection.write`). A round sends to an idle connection itself
(:meth:`Connection.send_now`), and leaves a send that must wait for the transport to the
writer, which finishes it (:func:`finish`) before anything else. JSON messages wait in their
own queue (events, in order) or per key (views, latest wins); messages the server pushes
unasked (notices) go out after the frames already offered. Requests are limited by a token
bucket per connection (:meth:`Connection.take_token`).

What waits is bounded in messages and in bytes (:func:`queue_messages`): the bytes are what
a subscriber that never reads costs, whatever the size of its events. An event waits as its
:class:`~.messages.EventText`, whose JSON body every subscription of the event shares; the
text with the subscription's key is made only when it is sent, so a thousand never-readers
of a busy type hold one copy of each event, not a thousand.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket

from tidings.intermediary.node.intermediary import Served
from tidings.intermediary.serving.counters import ServingCounters
from tidings.intermediary.serving.envelope import envelope
from tidings.intermediary.views.grants import NOTHING, Grant
from tidings.intermediary.views.messages import EventText


@dataclass
class Connection:
    """A subscriber's connection: its socket, the grant of the identity it proved at the
    handshake, what waits to be sent, and its request tokens."""

    id: int
    websocket: WebSocket
    grant: Grant = NOTHING
    slot: list[Served] | None = None
    #: Event messages (and replies pushed unasked) waiting, in order.
    texts: deque[str | EventText] = field(default_factory=deque)
    #: The latest view message per key not sent yet (a view is a latest value).
    views: dict[str, str] = field(default_factory=dict)
    #: The bytes of :attr:`texts` and :attr:`views` (what this subscriber's backlog weighs).
    queued_bytes: int = 0
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

    def queue(self, message: dict[str, Any] | EventText) -> None:
        """An event message joins the queue; a view message replaces the one of its key not
        sent yet (counted in :attr:`replaced`, unless it says ``unchanged``: as the pending
        one)."""
        if isinstance(message, EventText):
            self.texts.append(message)
            self.queued_bytes += message.size
        elif message["op"] != "view":
            text = json.dumps(message, default=str)
            self.texts.append(text)
            self.queued_bytes += len(text)
        elif (key := message["key"]) not in self.views or not message.get("unchanged"):
            if key in self.views:
                self.replaced += 1
                self.counters.replaced += 1
                self.queued_bytes -= len(self.views[key])
            text = json.dumps(message, default=str)
            self.views[key] = text
            self.queued_bytes += len(text)
        self.wake.set()

    def drop_queued(self) -> None:
        """Forget every message waiting (the connection is being closed)."""
        self.texts.clear()
        self.views.clear()
        self.queued_bytes = 0

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
            self.idle = not (self.texts or self.views or self.slot or self.notices)
            await self.wake.wait()
            self.idle = False
            self.wake.clear()
            if self.failure is not None:
                raise self.failure
            if self.pending is not None:
                pending, self.pending = self.pending, None
                await finish(*pending)
            counters = self.counters
            while self.texts:
                counters.messages_sent += 1
                waiting = self.texts.popleft()
                if isinstance(waiting, EventText):
                    self.queued_bytes -= waiting.size
                    text = waiting.text()
                else:
                    self.queued_bytes -= len(waiting)
                    text = waiting
                await self.websocket.send_text(text)
            views, self.views = self.views, {}
            for text in views.values():
                self.queued_bytes -= len(text)
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


def queue_messages(
    connections: Mapping[Any, Connection],
    messages: list[tuple[Any, dict[str, Any] | EventText]],
    limit: int,
    max_bytes: int | None = None,
) -> list[tuple[Any, str]]:
    """Queue a tick's JSON messages on their connections. A connection is too slow, and is
    returned with the reason, to close (what waits for it is dropped), when its backlog from
    earlier ticks is over ``limit`` messages (a large tick alone never closes anyone on this
    count), or when a message comes while more than ``max_bytes`` wait (None: no bound in
    bytes). So a connection holds at most ``limit`` messages plus one tick's, and at most
    ``max_bytes`` plus one message: a burst of one tick larger than ``max_bytes`` closes a
    subscriber that reads, too."""
    if not messages:
        return []
    over: dict[Any, str] = {}
    backlog = {s: len(c.texts) for s, c in connections.items()}
    for subscriber, message in messages:
        conn = connections.get(subscriber)
        if conn is None or conn.kicked.is_set() or subscriber in over:
            continue
        if backlog[subscriber] > limit:
            over[subscriber] = f"too slow: more than {limit} messages waiting to be sent"
        elif max_bytes is not None and conn.queued_bytes > max_bytes:
            over[subscriber] = f"too slow: more than {max_bytes} bytes waiting to be sent"
        else:
            conn.queue(message)
            continue
        conn.drop_queued()
    return list(over.items())


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
