"""The Eventer's register requests: converted, stored pipelined, answered in request order.

Registrations are pipelined: a connection's register requests are queued with the engine
without waiting for each to be stored (up to ``_MAX_IN_FLIGHT`` at a time), so that
requests waiting together are stored in one transaction, each still its own session, and
replies go out in request order as they complete. A register request is one engine
session; events that cannot be stored (a wildcard in the type, a bad payload, a type under
the servers' reserved consumer prefix) fail alone,
and a session a module aborts fails as a whole, while the server goes on. So does an event
of a type the client's grant does not cover (:mod:`.access`).

The tidings extension ``TidingsEventer.MsgRegisterReq`` registers events carrying the id of
the outbox event they come from; the store keeps each outbox event once, however often it is
sent, and the reply (``HatEventer.MsgRegisterRes``) holds the event stored first.

A large request is converted, and a large reply encoded, off the event loop (as a large
notification is, see :mod:`.notify`), so that one client's big batch does not
hold up the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator

from tidings.errors import ProtocolError
from tidings.events.model import EventType, NewEvent, StoredEvent
from tidings.events.sources import Source, eventer_source
from tidings.events.validation import reserved_type_problem
from tidings.logs import OncePerCause
from tidings.server.async_engine import AsyncEngine
from tidings.server.eventer.access import ClientAccess
from tidings.server.eventer.notify import INLINE_EVENTS
from tidings.wire import chatter, codec

log = logging.getLogger(__name__)
#: Refused events are logged once per client connection and minute (see _log_refused).
_once = OncePerCause(log)

#: Register requests, and their payload bytes, of one connection queued with the engine
#: before the server stops reading that connection (TCP then pushes back on the client).
_MAX_IN_FLIGHT = 1000
_MAX_IN_FLIGHT_BYTES = 16 * 1024 * 1024

#: Sends an encoded reply on a connection in a conversation (the server's, which drops a
#: client that does not read its replies).
SendReply = Callable[[chatter.Connection, str, bytes, chatter.Conversation], None]


class Registrations:
    """The register requests of one connection, from queued with the engine to replied."""

    __slots__ = (
        "_access",
        "_engine",
        "_last_answer",
        "_reply_tasks",
        "_send_reply",
        "_source",
        "client_id",
        "connection",
        "in_flight",
        "in_flight_bytes",
        "last_register",
        "last_reply",
    )

    def __init__(
        self,
        connection: chatter.Connection,
        engine: AsyncEngine,
        send_reply: SendReply,
        reply_tasks: set[asyncio.Task[None]],
        access: ClientAccess,
        client_id: int,
    ) -> None:
        self.connection = connection
        #: The connection's id among the server's (its Source's id).
        self.client_id = client_id
        #: What the client may register (an event of another type fails alone).
        self._access = access
        self._engine = engine
        self._send_reply = send_reply
        #: The server's register replies being encoded off the loop (kept there until sent).
        self._reply_tasks = reply_tasks
        self.in_flight = 0
        self.in_flight_bytes = 0
        #: The newest queued registration; the engine stores them in order.
        self.last_register: asyncio.Future[list[StoredEvent | None]] | None = None
        #: The newest register reply still being encoded (off the loop), if any.
        self.last_reply: asyncio.Task[None] | None = None
        #: The answer of the newest queued registration (replies follow request order).
        self._last_answer: _Answer | None = None
        #: The source of the current identity, made once: a Source validates its fields,
        #: which cost a small register a measurable part of its time when made per request.
        self._source: Source | None = None

    @property
    def source(self) -> Source:
        """Who registers through this connection: its id and its client's identity (which
        a login may have changed)."""
        identity, source = self._access.admission.identity, self._source
        if source is None or source.name != identity:
            source = self._source = eventer_source(self.client_id, identity)
        return source

    async def wait(self) -> None:
        """Wait until every registration this connection queued so far is done."""
        last = self.last_register
        if last is not None and not last.done():
            await asyncio.wait([last])

    async def register(self, message: chatter.Message, outbox: bool) -> None:
        """Queue the convertible events of a register request (``outbox``: the tidings
        extension's records) as one session and go on; the reply (unless the request was
        sent with ``last``, hat-event's fire-and-forget) is sent when it is stored."""
        items = message.data if isinstance(message.data, list) else []
        convert = (self.connection.peer, items, outbox, self._access.grants.may_register)
        # A large request is converted off the loop, as its frame was decoded; a small one
        # here, without a coroutine or a thread hop.
        if len(items) > INLINE_EVENTS:
            new_events, refused = await asyncio.to_thread(_convert, *convert)
        else:
            new_events, refused = _convert(*convert)
        valid, size = self._sorted_out(new_events, refused)
        if not valid:
            # Nothing to store; the reply still waits for the replies before it.
            self._after_earlier(lambda: self._reply(message, [None] * len(new_events)))
            return
        if self._full:
            await self.wait()
        self._submit(message, new_events, valid, size)

    def register_now(self, message: chatter.Message, outbox: bool) -> bool:
        """:meth:`register` without waiting, if it need not wait (a small request, room
        in flight): True if it was queued so (or answered), False if it was left alone
        for :meth:`register`."""
        items = message.data if isinstance(message.data, list) else []
        if len(items) > INLINE_EVENTS or self._full:
            return False
        new_events, refused = _convert(
            self.connection.peer, items, outbox, self._access.grants.may_register
        )
        valid, size = self._sorted_out(new_events, refused)
        if not valid:
            self._after_earlier(lambda: self._reply(message, [None] * len(new_events)))
        else:
            self._submit(message, new_events, valid, size)
        return True

    @property
    def _full(self) -> bool:
        """As many registrations (or payload bytes) in flight as the connection may have."""
        return self.in_flight >= _MAX_IN_FLIGHT or self.in_flight_bytes >= _MAX_IN_FLIGHT_BYTES

    def _sorted_out(
        self, new_events: list[NewEvent | None], refused: list[EventType]
    ) -> tuple[list[NewEvent], int]:
        """The events to store of a converted request and their payload bytes; the ones
        the client's grant refused are counted and logged."""
        if refused:
            self._access.refused_events(refused)
        valid = [event for event in new_events if event is not None]
        size = 0
        for event in valid:
            if event.payload is not None:
                size += len(event.payload)
        return valid, size

    def _submit(
        self,
        message: chatter.Message,
        new_events: list[NewEvent | None],
        valid: list[NewEvent],
        size: int,
    ) -> None:
        """Queue the valid events of a request with the engine; its reply follows."""
        # Requests waiting behind this one (pipelined, fire-and-forget) join its group.
        future = self._engine.submit(
            valid, source=self.source, more_coming=self.connection.has_received
        )
        self.in_flight += 1
        self.in_flight_bytes += size
        self.last_register = future
        previous, answer = self._last_answer, _Answer()
        self._last_answer = answer

        def done(future: asyncio.Future[list[StoredEvent | None]]) -> None:
            self.in_flight -= 1
            self.in_flight_bytes -= size
            try:
                if not future.cancelled():
                    reply(future)
            except Exception as exc:  # a bug: the client would wait for the reply for ever
                self._reply_failed(exc)
            finally:
                answer.sent()

        def reply(future: asyncio.Future[list[StoredEvent | None]]) -> None:
            error = future.exception()
            if error is not None:  # a module aborted the session, or the database failed
                log.error(
                    "eventer: register of %d events from %s failed: %s",
                    len(valid),
                    self.connection.peer,
                    error,
                    extra={"peer": self.connection.peer, "events": len(valid)},
                )
                stored: Iterator[StoredEvent | None] = iter([None] * len(valid))
            else:
                stored = iter(future.result())
            results = [None if event is None else next(stored) for event in new_events]
            self._reply(message, results)

        if future.done() and (previous is None or previous.done):
            done(future)  # written at once (inline): answered without waiting a loop turn
        else:
            future.add_done_callback(done)

    def _after_earlier(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the queued registrations are answered (now if they are).

        Chained to the last one's answer rather than to its future: a future that is done
        may still have its answer waiting for a loop turn."""
        last = self._last_answer
        if last is None or last.done:
            action()
        else:
            last.then.append(action)

    def _reply(self, message: chatter.Message, results: list[StoredEvent | None]) -> None:
        """Send a register reply, after the earlier ones; a large one is encoded off the
        loop."""
        if message.last or not self.connection.is_open:
            return
        earlier = self.last_reply
        if len(results) <= INLINE_EVENTS and (earlier is None or earlier.done()):
            try:
                body = codec.encode_register_results(results)
            except Exception as exc:  # a bug: the client would wait for the reply for ever
                self._reply_failed(exc)
                return
            self._send_reply(self.connection, "MsgRegisterRes", body, message.conversation)
            return
        task = asyncio.get_running_loop().create_task(self._reply_later(message, results, earlier))
        self.last_reply = task
        self._reply_tasks.add(task)
        task.add_done_callback(self._reply_tasks.discard)

    async def _reply_later(
        self,
        message: chatter.Message,
        results: list[StoredEvent | None],
        earlier: asyncio.Task[None] | None,
    ) -> None:
        try:
            if len(results) > INLINE_EVENTS:
                body = await asyncio.to_thread(codec.encode_register_results, results)
            else:
                body = codec.encode_register_results(results)
            if earlier is not None:
                await asyncio.wait([earlier])
        except Exception as exc:  # a bug: the client would wait for the reply for ever
            self._reply_failed(exc)
            return
        self._send_reply(self.connection, "MsgRegisterRes", body, message.conversation)

    def _reply_failed(self, exc: Exception) -> None:
        """A register reply cannot be made (a bug): the client would wait for it for ever,
        so its connection is closed, saying why; the server goes on."""
        log.error("eventer: cannot encode a register reply: %s", exc, exc_info=exc)
        self.connection.close(f"register reply failed: {type(exc).__name__}: {exc}")


class _Answer:
    """Whether a registration's reply has been sent (or given to the encoder), and what
    waits for that: the replies of empty requests sent after it."""

    __slots__ = ("done", "then")

    def __init__(self) -> None:
        self.done = False
        self.then: list[Callable[[], None]] = []

    def sent(self) -> None:
        self.done = True
        for action in self.then:
            action()
        self.then.clear()


#: Whether the client may register an event of a type (its grant).
MayRegister = Callable[[EventType], bool]


def _convert(
    peer: str, items: list[codec.Value], outbox: bool, may_register: MayRegister
) -> tuple[list[NewEvent | None], list[EventType]]:
    """The NewEvents of a register request's items (``outbox``: the tidings extension's
    records), None for each that fails, and the types of those refused by the client's
    grant."""
    new_events: list[NewEvent | None] = []
    refused: list[EventType] = []
    for index, item in enumerate(items):
        if not outbox:
            new_event = _new_event(peer, index, item, None)
        elif isinstance(item, dict) and "outboxEventId" in item and "event" in item:
            new_event = _new_event(peer, index, item["event"], item["outboxEventId"])
        else:
            _log_refused(peer, index, "expected a record {outboxEventId, event}")
            new_event = None
        if new_event is not None and not may_register(new_event.type):
            refused.append(new_event.type)  # logged once per type by the caller
            new_event = None
        new_events.append(new_event)
    return new_events, refused


def _new_event(
    peer: str, index: int, item: codec.Value, outbox_event_id: object
) -> NewEvent | None:
    """The NewEvent of one register item, or None (logged) if it cannot be one; such an item
    fails alone, as an event with an invalid type does in the engine."""
    if outbox_event_id is not None and not isinstance(outbox_event_id, str):
        _log_refused(peer, index, f"outboxEventId {outbox_event_id!r} is not a string")
        return None
    try:
        new_event = codec.register_event_from_sbs(item, f"event {index}", outbox_event_id)
    except ProtocolError as exc:
        _log_refused(peer, index, str(exc))
        return None
    # The servers' own consumer events are written by the servers alone: a client's would
    # move stream consumers past events they never read.
    if (problem := reserved_type_problem(new_event.type)) is not None:
        _log_refused(peer, index, problem)
        return None
    return new_event


def _log_refused(peer: str, index: int, problem: str) -> None:
    """Log a refused event once per client connection (then counted): one request may
    carry thousands of bad events, and a line each would be a flood for the price of one
    frame."""
    _once.log(
        logging.WARNING,
        peer,
        f"eventer: event {index} from {peer} refused: {problem}",
        extra={"peer": peer, "index": index},
    )
