"""The Eventer server: hat-event 0.8.5's client protocol, served from an :class:`AsyncEngine`.

Clients connect over chatter (:mod:`tidings.wire.chatter`) and register events, query them
and subscribe to newly stored ones, as with a hat-event 0.8.5 server, whose clients work
unchanged. As 0.8.5 does, the server registers an ``('event', 'eventer')`` event with the
JSON payload ``"CONNECTED"`` for every connection before it handles any of its messages, and
``"DISCONNECTED"`` when the connection ends.

Each connection is served by a task of its own, in request order; connections never wait
for each other's sockets. A small register request that arrives while that task waits for
the next request is queued with the engine at once by the task reading the socket
(:meth:`chatter.Connection.take_directly`), which keeps the order and spares a turn of the
event loop per request. Register requests (hat-event's and the tidings extension
``TidingsEventer.MsgRegisterReq``) are pipelined with the engine and answered in request
order (:mod:`.registrations`). A query waits for the connection's earlier
registrations, so a client always reads its own writes. A query always gets a reply: an
invalid one is answered with no events, and logged.

**Slow subscribers.** Notifications are written without waiting for the client's socket, so
that registration never waits for a subscriber and one slow subscriber never delays others.
What a client has not read yet waits in its connection's send buffer. A client with more
than ``max_subscriber_lag_bytes`` unsent that has taken nothing for ``ping_interval``, or
with more than four times that unsent, is disconnected when a new message is due (logged
with the reason "slow subscriber") and its buffer is dropped, which keeps the server's
memory bounded; a burst over the bound (a big register's reply and notification) does not
drop a client that reads it. Large notifications and register replies are encoded off the
event loop. It may reconnect and catch up with a query. Small replies share that buffer; a
query reply over 1 MiB is streamed instead (:mod:`.query_replies`), a chunk at a
time as the client reads it, so it never counts as lag, and a client that takes nothing of
it for ``ping_interval`` is closed.

Bad input on a socket (garbage, a truncated or oversize frame, an unknown message type,
undecodable SBS, a message a client must not send, an invalid subscription) closes that
connection with one log line; every other client is served on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Self

from tidings.accept import TOO_MANY_FROM_ADDRESS
from tidings.config.listener import ListenerLimitsConfig, limits_of
from tidings.config.server import (
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_SUBSCRIBER_LAG_BYTES,
    require_positive_ints,
)
from tidings.config.tls import TlsServerConfig
from tidings.errors import ConnectionClosed, ProtocolError, StoreError
from tidings.events.matching import TypeMatcher
from tidings.events.model import EventType, StoredEvent, json_event
from tidings.events.sources import Source, eventer_source
from tidings.server.async_engine import AsyncEngine
from tidings.server.eventer.access import Admission, ClientAccess, EventerAccess
from tidings.server.eventer.counters import EventerCounters
from tidings.server.eventer.notify import Notifier
from tidings.server.eventer.query_replies import (
    EMPTY_REPLY,
    ReplyPlan,
    is_bulk,
    plan_latest_by_key,
    plan_reply,
    stream_body,
)
from tidings.server.eventer.registrations import Registrations
from tidings.wire import chatter, chatter_server, codec

log = logging.getLogger(__name__)

#: Type of the events registered when a client connects and disconnects (hat-event).
EVENTER_EVENT_TYPE: EventType = ("event", "eventer")
#: JSON payloads of the eventer event (``hat-event://server.yaml#/definitions/events/eventer``).
STATUS_CONNECTED = "CONNECTED"
STATUS_DISCONNECTED = "DISCONNECTED"


#: The register requests: hat-event's, and the tidings extension's (outbox records).
_HAT_REGISTER = (codec.EVENTER, "MsgRegisterReq")
_REGISTER_REQUESTS = frozenset({_HAT_REGISTER, (codec.TIDINGS_EVENTER, "MsgRegisterReq")})


class _Client:
    """One connected client: who it is and what it may do, its subscription (None until it
    subscribes) and its register requests."""

    __slots__ = ("access", "connection", "matcher", "registrations")

    def __init__(
        self, connection: chatter.Connection, access: ClientAccess, registrations: Registrations
    ) -> None:
        self.connection = connection
        self.access = access
        self.matcher: TypeMatcher | None = None
        self.registrations = registrations


_RequestHandler = Callable[[_Client, chatter.Message], Awaitable[None]]


class EventerServer:
    """A listening Eventer server; create it with :meth:`start`, stop it with :meth:`aclose`."""

    def __init__(
        self,
        engine: AsyncEngine,
        max_subscriber_lag_bytes: int,
        stall_seconds: float,
        counters: EventerCounters | None = None,
        access: EventerAccess | None = None,
    ) -> None:
        self._engine = engine
        self._access = access or EventerAccess()
        self._max_lag = max_subscriber_lag_bytes
        #: A streamed reply of which the client takes nothing for this long closes it.
        self._stall_seconds = stall_seconds
        self._clients: set[_Client] = set()
        #: Each admitted connection's id, its Source's (from 1, as hat-event numbers them).
        self._client_ids = itertools.count(1)
        #: What it served, for the server's metrics (:mod:`tidings.server.metrics`); given
        #: when they outlive this server (a Monitor's blessing opens a new one each time).
        self.counters = counters if counters is not None else EventerCounters()
        self._closing = False
        self._closed = asyncio.Event()
        self._server: chatter_server.Server | None = None
        self._port = 0
        self._on_table_load: Callable[[EventType], None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._notifier: Notifier[_Client] = Notifier(
            lambda client, body: self._send_notify(client.connection, body),
            lambda client, reason: client.connection.close(reason),
        )
        #: Register replies being encoded off the loop (kept here until sent).
        self._reply_tasks: set[asyncio.Task[None]] = set()
        self._requests: dict[tuple[str, str], _RequestHandler] = {
            (codec.EVENTER, "MsgSubscribe"): self._on_subscribe,
            (codec.EVENTER, "MsgRegisterReq"): self._on_register,
            (codec.EVENTER, "MsgQueryReq"): self._on_query,
            (codec.TIDINGS_EVENTER, "MsgRegisterReq"): self._on_register_outbox,
            (codec.TIDINGS_EVENTER, "MsgLatestByKeyReq"): self._on_latest_by_key,
            (codec.TIDINGS_EVENTER, "MsgLoginReq"): self._on_login,
        }

    @classmethod
    async def start(
        cls,
        address: str,
        engine: AsyncEngine,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_subscriber_lag_bytes: int = DEFAULT_MAX_SUBSCRIBER_LAG_BYTES,
        ping_interval: float = chatter.DEFAULT_PING_INTERVAL,
        counters: EventerCounters | None = None,
        tls: TlsServerConfig | None = None,
        access: EventerAccess | None = None,
        on_table_load: Callable[[EventType], None] | None = None,
        accept: ListenerLimitsConfig | None = None,
    ) -> Self:
        """Listen on ``address`` (``tcp+sbs://host:port``, or ``ssl+sbs://`` with ``tls``;
        port 0 for any free port). ``access`` says who is served and may do what (default:
        anonymous clients on loopback, granted everything); ``accept`` bounds the
        connections per client address and the TLS handshake (:mod:`tidings.accept`).
        ``on_table_load`` hears of each type a client loads as a table (latest by key; the
        log's retention spares those)."""
        require_positive_ints(
            "eventer server",
            max_frame_bytes=max_frame_bytes,
            max_subscriber_lag_bytes=max_subscriber_lag_bytes,
        )
        server = cls(engine, max_subscriber_lag_bytes, ping_interval, counters, access)
        server._on_table_load = on_table_load
        server._server = await chatter_server.listen(
            address,
            server._serve,
            tls=None if tls is None else tls.context(),
            max_frame_bytes=max_frame_bytes,
            ping_interval=ping_interval,
            handshake_timeout=limits_of(accept).tls_handshake_timeout.total_seconds(),
            max_per_address=limits_of(accept).max_connections_per_address,
            on_refused=server._refused_connection,
        )
        server._port = server._server.port
        # Early: subscribers hear of a registration when it is answered, also before its
        # commit under durability: periodic (as hat-event's lmdb backend notifies).
        server._unsubscribe = engine.subscribe(server._notify, early=True)
        log.info(
            "eventer server listening on %s",
            address,
            extra={"address": address, "port": server.port},
        )
        return server

    def _refused_connection(self, reason: str) -> None:
        if reason == TOO_MANY_FROM_ADDRESS:
            self.counters.refused_connections += 1
        else:
            self.counters.refused_handshakes += 1

    @property
    def port(self) -> int:
        """The bound TCP port (the chosen one after listening on port 0), even once closed."""
        return self._port

    @property
    def client_count(self) -> int:
        """Connected clients whose CONNECTED event is registered."""
        return len(self._clients)

    async def aclose(self) -> None:
        """Stop listening and close every client, registering their DISCONNECTED events.

        Once it returns, the server registers nothing more, so the engine may be closed.
        """
        if self._closing:
            await self._closed.wait()  # a concurrent caller returns only once it is done too
            return
        self._closing = True
        try:
            if self._server is not None:
                await self._server.aclose()
            if self._unsubscribe is not None:
                self._unsubscribe()
            await self._notifier.aclose()
        finally:
            self._closed.set()
        log.info("eventer server closed", extra={"port": self._port})

    # --- connections ----------------------------------------------------------------------

    async def _serve(self, connection: chatter.Connection) -> None:
        """Admit a connection's client (:mod:`.access`), then serve it from its CONNECTED
        event to its DISCONNECTED event."""
        if self._closing:
            return
        admission = await self._admit(connection)
        if admission is None:
            self.counters.refused_clients += 1
            return
        client_id = next(self._client_ids)
        await self._register_status(
            connection, STATUS_CONNECTED, eventer_source(client_id, admission.identity)
        )
        access = ClientAccess(connection, admission, self.counters)
        registrations = Registrations(
            connection, self._engine, self._send_encoded, self._reply_tasks, access, client_id
        )
        client = _Client(connection, access, registrations)
        self._clients.add(client)
        connection.take_directly(lambda message: self._take_now(client, message))
        log.debug("eventer client %s connected", access.who, extra={"peer": connection.peer})
        try:
            await self._serve_requests(client)
        except ConnectionClosed:
            pass
        finally:
            self._clients.discard(client)
            connection.close()
            log.debug(
                "eventer client %s disconnected",
                connection.peer,
                extra={"peer": connection.peer, "reason": connection.close_reason},
            )
            await self._register_status(connection, STATUS_DISCONNECTED, registrations.source)

    async def _admit(self, connection: chatter.Connection) -> Admission | None:
        """Who the client is, or None once its connection is closed for it (logged)."""
        admission = self._access.admit(connection)
        if isinstance(admission, str):
            connection.close(admission)
            return None
        if admission.grants is None:
            return await self._access.await_login(
                connection, admission.anonymous_refused, self._stall_seconds
            )
        return admission

    async def _serve_requests(self, client: _Client) -> None:
        """Handle the client's messages one by one until its connection closes."""
        connection = client.connection
        while connection.is_open:
            message = connection.receive_ready() or await connection.receive()
            if self._take_now(client, message):  # a small register: no coroutine to await
                continue
            handler = self._requests.get((message.module, message.type))
            if handler is None:
                connection.close(
                    f"unexpected message {message.module}.{message.type} from an eventer client"
                )
                return
            if handler != self._on_login:
                client.access.fresh = False
            await handler(client, message)

    def _take_now(self, client: _Client, message: chatter.Message) -> bool:
        """Handle a small register request at once, without a coroutine: True if it was
        (queued with the engine, or answered), False for any other message and for a
        register that must wait (:meth:`Registrations.register`).

        The client's task calls it for each message it takes, and the task reading the
        socket for a message received while the client's task waits for one (see
        :meth:`chatter.Connection.take_directly`: everything received before it was
        handled, so the order is the same), saving that task a turn of the event loop."""
        key = (message.module, message.type)
        if key not in _REGISTER_REQUESTS:
            return False
        client.access.fresh = False
        try:
            if not client.registrations.register_now(message, outbox=key != _HAT_REGISTER):
                return False
        except ConnectionClosed:
            pass
        except Exception as exc:  # a bug: served by the client's task, it would close too
            log.exception("eventer: register from %s failed", client.connection.peer)
            client.connection.close(f"register failed: {type(exc).__name__}: {exc}")
        self.counters.register_requests += 1
        return True

    async def _register_status(
        self, connection: chatter.Connection, status: str, source: Source
    ) -> None:
        """Register the eventer event ``status`` on behalf of the connection (as hat-event
        does); a failure is logged, never raised, since serving or closing the connection
        must go on regardless."""
        event = json_event(EVENTER_EVENT_TYPE, status)
        try:
            await self._engine.register([event], source)
        except Exception as exc:
            log.error(
                "eventer: cannot register %s of %s: %s",
                status,
                connection.peer,
                exc,
                extra={"peer": connection.peer, "status": status},
            )

    # --- requests -------------------------------------------------------------------------

    async def _on_login(self, client: _Client, message: chatter.Message) -> None:
        """The tidings extension's login, as a client's first message: from then on it is
        the identity it names. A refused login (answered, and logged) leaves it as it was;
        so does a late one, refused unchecked (one password check per connection)."""
        access = client.access
        if not access.fresh or access.admission.identity is not None:
            said = "log in with the first message, once, before any other request"
            reply = {"success": False, "message": said}
            self.counters.refused_logins += 1
            client.connection.send(
                codec.TIDINGS_EVENTER, "MsgLoginRes", reply, conversation=message.conversation
            )
            return
        access.fresh = False
        admission = await self._access.answer_login(client.connection, message)
        if admission is None:
            self.counters.refused_logins += 1
        else:
            access.admission = admission

    async def _on_subscribe(self, client: _Client, message: chatter.Message) -> None:
        """Replace the client's subscription, narrowed to its grant; an invalid one closes
        the connection."""
        try:
            types = client.access.narrow_subscription([tuple(t) for t in message.data])
            # Subscribed to nothing (hat's client subscribes so by default): not a subscriber,
            # so that a batch nobody subscribed to costs nothing to notify.
            client.matcher = TypeMatcher(types) if types else None
        except (ProtocolError, StoreError) as exc:
            client.connection.close(f"invalid subscription: {exc}")

    async def _on_register(self, client: _Client, message: chatter.Message) -> None:
        self.counters.register_requests += 1
        await client.registrations.register(message, outbox=False)

    async def _on_register_outbox(self, client: _Client, message: chatter.Message) -> None:
        self.counters.register_requests += 1
        await client.registrations.register(message, outbox=True)

    async def _on_query(self, client: _Client, message: chatter.Message) -> None:
        """Answer a query, always (as 0.8.5): an invalid one gets no events and a log line.

        The reply is planned in the query pool (see :mod:`.query_replies`); a
        large one is streamed as the client reads it, so it is never "lag": a client that
        takes nothing of it for ``ping_interval`` is closed instead. The connection's next
        request waits until the reply is sent.
        """
        await client.registrations.wait()
        self.counters.queries += 1
        try:
            granted = client.access.narrow_query(codec.query_from_sbs(message.data))
            plan = (
                EMPTY_REPLY
                if granted is None
                else await self._engine.read(
                    plan_reply, self._engine.store, granted, bulk=is_bulk(granted)
                )
            )
        except (ProtocolError, StoreError) as exc:
            self._refused(client, "query", exc)
            plan = EMPTY_REPLY
        await self._send_plan(client, message, plan)

    async def _on_latest_by_key(self, client: _Client, message: chatter.Message) -> None:
        """The tidings extension ``TidingsEventer.MsgLatestByKeyReq``: a page of the newest
        event of each key of one type (:mod:`tidings.server.store.latest_by_key`), answered
        as a query is; an invalid request gets no events and a log line."""
        await client.registrations.wait()
        self.counters.queries += 1
        try:
            event_type, after, max_bytes = codec.latest_by_key_request_from_sbs(message.data)
            if self._on_table_load is not None and client.access.may_query(event_type):
                self._on_table_load(event_type)
            plan = (
                await self._engine.read(
                    plan_latest_by_key, self._engine.store, event_type, after, max_bytes, bulk=True
                )
                if client.access.may_query(event_type)
                else EMPTY_REPLY
            )
        except (ProtocolError, StoreError) as exc:
            self._refused(client, "latest by key", exc)
            plan = EMPTY_REPLY
        await self._send_plan(client, message, plan)

    def _refused(self, client: _Client, what: str, exc: Exception) -> None:
        log.warning(
            "eventer: %s from %s refused, answered with no events: %s",
            what,
            client.connection.peer,
            exc,
            extra={"peer": client.connection.peer, "error": str(exc)},
        )

    async def _send_plan(self, client: _Client, message: chatter.Message, plan: ReplyPlan) -> None:
        """Send a planned ``MsgQueryRes``: whole if small, else streamed from its spool."""
        connection = client.connection
        if plan.body is not None:
            self._send_encoded(connection, "MsgQueryRes", plan.body, message.conversation)
            await connection.drain()
            return
        log.debug(
            "eventer: streaming %d events (%d bytes) to %s",
            plan.count,
            plan.size,
            connection.peer,
            extra={"peer": connection.peer, "events": plan.count, "bytes": plan.size},
        )
        try:
            await connection.send_stream(
                codec.EVENTER,
                "MsgQueryRes",
                plan.size,
                stream_body(plan),
                conversation=message.conversation,
                stall_seconds=self._stall_seconds,
            )
        finally:
            plan.close()

    # --- notifications --------------------------------------------------------------------

    def _notify(self, events: list[StoredEvent]) -> None:
        """Send each subscribed client the events of a newly stored batch it subscribed to.

        Runs on the event loop for every batch; it never waits for a socket (a large batch
        is encoded off the loop, see :mod:`.notify`), and drops the clients that fall more
        than ``max_subscriber_lag_bytes`` behind.
        """
        self._notifier.notify(
            events,
            [
                (client, client.matcher)
                for client in self._clients
                if client.matcher is not None and client.connection.is_open
            ],
        )

    def _send_encoded(
        self,
        connection: chatter.Connection,
        type_name: str,
        body: bytes,
        conversation: chatter.Conversation,
    ) -> None:
        """Send an encoded reply; a client that does not read its replies is dropped like a
        slow subscriber, so that its buffer cannot grow without bound."""
        if self._keeps_up(connection):
            with contextlib.suppress(ConnectionClosed):
                connection.send_encoded(codec.EVENTER, type_name, body, conversation=conversation)

    def _send_notify(self, connection: chatter.Connection, body: bytes) -> None:
        if self._keeps_up(connection):
            with contextlib.suppress(ConnectionClosed):
                connection.send_encoded(codec.EVENTER, "MsgNotify", body, last=True)
                self.counters.notifications += 1

    def _keeps_up(self, connection: chatter.Connection) -> bool:
        """Whether the client reads enough to be sent more; if not, it is dropped (see
        :meth:`chatter.Connection.lagging`: a burst over the bound is fine while the client
        takes it, up to four times the bound)."""
        reason = connection.lagging(self._max_lag, self._stall_seconds, "max_subscriber_lag_bytes")
        if reason is not None:
            connection.close(f"slow subscriber: {reason}")
        return connection.is_open
