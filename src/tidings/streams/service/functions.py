"""One stream's FTN18 functions: what a checked request does.

The transport (:mod:`.app`) hands every request here with its channel (a WebSocket, or
None for HTTP) and whether that channel is secure. This module applies the interface's
requirements (FTN3 ``requires``: a secure channel for ``futoin.evt.gen``, a bi-directional
one for ``futoin.evt.push``, a user for everything but ping), authenticates the caller and
checks what the user may do on the stream (:mod:`.access`: a refusal is ``Unauthorized``,
counted in the stream's metrics with the failed authentications, :mod:`.refusals`) and runs
the function. Consumers belong to the calling user: ``(user, component)``.

- ``registerConsumer``: persisted, repeatable; ``LIVE`` is ``LiveNotAllowed``.
- ``pollEvents``: ``last_id`` acknowledges (never backwards) and the reply holds the events
  after the consumer's stored position in id order, at most 1,000 and within the reply size
  the caller's interface version allows. When nothing it wants is there, its position moves
  past what it does not want, and past what its user may not read (FTN18: skipped events
  count as delivered). ``LIVE`` keeps no state: events after ``last_id``, or the newest ones
  without it. A ``want`` naming a type the stream does not carry is InvalidRequest, naming
  the types it carries (here and for ``readyToReceive``); one naming a type the user may not
  read is Unauthorized. Either way the consumer is sent its :class:`.selection.Selection`.
- ``readyToReceive``: starts a push session on the channel (:mod:`.push`), tracked with the
  stream's others (:mod:`.sessions`).
- ``addEvent``: if the user may add the type and its data passes the user's filter, one
  event registered through the engine (a session: modules run, subscribers notified); its
  id. The native ``addXferEvent`` is :meth:`tidings.Outbox.emit`
  in the caller's transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from tidings.config.streams import StreamConfig
from tidings.errors import EngineError, StoreError, StreamError, StreamRefused
from tidings.events.model import NewEvent, PayloadKind, StoredEvent
from tidings.events.sources import Source, SourceKind
from tidings.logs import OncePerCause
from tidings.server.async_engine import AsyncEngine
from tidings.streams.consumers.positions import Consumers
from tidings.streams.consumers.replication import Covers, consumer_event
from tidings.streams.protocol.channel import Channel
from tidings.streams.protocol.encoding import event_list
from tidings.streams.protocol.ftn3 import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    LIVE_NOT_ALLOWED,
    SECURITY_ERROR,
    Request,
)
from tidings.streams.protocol.interfaces import (
    LIVE,
    PING_FUNCTION,
    RECEIVER,
    interface_of,
    message_limit,
)
from tidings.streams.service.access import StreamAccess
from tidings.streams.service.auth import Users
from tidings.streams.service.push import Acknowledge, PushSession
from tidings.streams.service.reader import StreamReader
from tidings.streams.service.refusals import AUTHENTICATION, Refusals
from tidings.streams.service.selection import Selection
from tidings.streams.service.sessions import PushSessions
from tidings.streams.typemap import TypeMap

log = logging.getLogger(__name__)

T = TypeVar("T")

#: FTN18's largest event list.
MAX_EVENTS = 1000
#: Bytes of a reply besides its events.
_REPLY_OVERHEAD = 64


class RawJson(bytes):
    """A result already encoded as JSON (an event list), put into the reply as it is."""


class Deferred:
    """A result whose work the request's turn has set going, in order (an event submitted
    to the engine), and that is known later: the connection goes on to its next request
    meanwhile, so a consumer's pipelined ``addEvent`` calls share the engine's group
    commits instead of waiting for one commit each."""

    def __init__(self, result: Awaitable[Any]) -> None:
        self.result = result


class StreamService:
    """The functions of one stream."""

    def __init__(
        self,
        config: StreamConfig,
        type_map: TypeMap,
        engine: AsyncEngine,
        reader: StreamReader,
        consumers: Consumers,
        users: Users,
        access: StreamAccess,
        executor: Executor,
        password_checks: Executor,
    ) -> None:
        self.config = config
        self.name = config.name
        self._type_map = type_map
        self._engine = engine
        self._reader = reader
        self._consumers = consumers
        self._users = users
        self._access = access
        self.refusals = Refusals(self.name)
        self._executor = executor
        self._password_checks = password_checks
        self._push = PushSessions(self.name)
        self._consumer_locks: dict[tuple[str, str], asyncio.Lock] = {}
        #: What its transport logs once per cause: malformed requests, failed logins,
        #: failures (:mod:`.app`); one per stream and run, so a restart starts afresh.
        self.problems = OncePerCause(logging.getLogger("tidings.streams.service.app"))

    async def call(self, request: Request, channel: Channel | None, secure: bool) -> Any:
        """Run one request; its result, or StreamError with the FTN3 error to send."""
        interface, function = interface_of(request)
        if interface.bidirect and channel is None:
            raise StreamError(INVALID_REQUEST, "Bi-Direct Channel is required")
        if interface.secure and not secure:
            raise StreamError(SECURITY_ERROR, "Insecure channel")
        params = function.check(request.params)
        if function is PING_FUNCTION:
            return {"echo": params["echo"]}
        if interface.anonymous:
            raise StreamError(
                INVALID_REQUEST, f"{request.func} is not a function of {request.iface}"
            )
        user = self._users.remembered(request.sec) or await self._authenticate(request.sec)
        try:
            return await self._run(request, params, channel, user)
        except StreamRefused as exc:
            self.refusals.record(exc.user, exc.reason, exc.description)
            raise

    async def _run(
        self, request: Request, params: dict[str, Any], channel: Channel | None, user: str
    ) -> Any:
        """Run an authenticated user's request, if its permissions allow it."""
        self._access.check_stream(user)
        if request.func == "registerConsumer":
            return await self._register(user, params["component"])
        if request.func == "addEvent":
            return await self._add_event(user, params["type"], params["data"])
        component = params["component"]
        selection = self._access.selection(user, component, params["want"])
        if request.func == "pollEvents":
            limit = message_limit(request.minor) - _REPLY_OVERHEAD
            return await self._poll(user, component, params["last_id"], selection, limit)
        assert request.func == "readyToReceive" and channel is not None
        return await self._ready(channel, user, component, selection, request.minor)

    def push_sessions(self) -> int:
        """How many reliable consumers have a push session running (for the metrics)."""
        return self._push.reliable

    def refusal_counts(self) -> dict[tuple[str, str], int]:
        """The refusals so far by (user, reason), copied whole (for the metrics, read in
        their thread while the loop goes on counting)."""
        return dict(self.refusals.counts)

    async def channel_closed(self, channel: Channel) -> None:
        """Stop the push session on a channel that closed, if it has one."""
        await self._push.stop_channel(channel)

    async def aclose(self) -> None:
        """Stop every push session."""
        await self._push.aclose()

    async def _register(self, user: str, component: str) -> bool:
        if component == LIVE:
            raise StreamError(LIVE_NOT_ALLOWED, "the LIVE component cannot be registered")
        self._access.check_component(user, component)
        created = await self._blocking(self._consumers.register, self.name, user, component)
        if created:
            await self._tell_group(user, component, {})
            log.info(
                "stream consumer registered",
                extra={"stream": self.name, "user": user, "component": component},
            )
        return True

    async def _poll(
        self,
        user: str,
        component: str,
        last_id: int | None,
        selection: Selection,
        max_bytes: int,
    ) -> RawJson:
        if component == LIVE:
            if last_id is None:
                batch = await self._reader.newest(selection, MAX_EVENTS, max_bytes)
            else:
                batch = await self._reader.read(
                    last_id, selection, MAX_EVENTS, max_bytes, exhaustive=True
                )
            return RawJson(event_list(batch.events))
        async with self._lock(user, component):
            if last_id is not None:
                position = await self._acknowledge(user, component, last_id)
            else:
                position = await self._blocking(
                    self._consumers.position, self.name, user, component
                )
            batch = await self._reader.read(position, selection, MAX_EVENTS, max_bytes)
            if not batch.events and batch.scanned > position:
                await self._acknowledge(user, component, batch.scanned)
        return RawJson(event_list(batch.events))

    async def _ready(
        self,
        channel: Channel,
        user: str,
        component: str,
        selection: Selection,
        minor: int,
    ) -> bool:
        """Start pushing to ``channel``; the call returns at once, the pushes follow."""
        await self._push.stop_channel(channel)
        config = self.config.push

        def session(start: int, acknowledge: Acknowledge | None) -> PushSession:
            return PushSession(
                self._reader,
                channel,
                config,
                function=f"{RECEIVER}:1.{minor}:onEvents",
                message_bytes=message_limit(minor),
                selection=selection,
                start=start,
                acknowledge=acknowledge,
                ack_timeout=config.ack_timeout.total_seconds(),
            )

        if component == LIVE:
            self._push.start(session(self._reader.feed.high, None), channel, None)
            return True
        key = (user, component)
        # The whole change under the consumer's lock: a session replaced first records
        # the replies it got (stop_session's grace), then the new one starts from the
        # position that leaves, so nothing acknowledged is sent again; two
        # readyToReceive of one consumer cannot both start.
        async with self._lock(user, component):
            await self._push.stop_consumer(key)
            start = await self._blocking(self._consumers.position, self.name, user, component)

            async def acknowledge(position: int) -> None:
                await self._acknowledge(user, component, position)

            self._push.start(session(start, acknowledge), channel, key)
        return True

    async def _add_event(self, user: str, name: str, data: Any) -> Deferred:
        self._access.check_add(user, name, data)
        event_type = self._type_map.event_type_of(name)
        if event_type is None:
            raise StreamError(
                INVALID_REQUEST,
                f"stream {self.name} cannot generate events of type {name}: "
                + (
                    "its patterns are not one exact event type"
                    if name in self._type_map.names
                    else f"it carries only {', '.join(self._type_map.names)}"
                ),
            )
        try:
            payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except ValueError as exc:
            raise StreamError(INVALID_REQUEST, f"data is not JSON: {exc}") from None
        event = NewEvent(event_type, payload.encode(), PayloadKind.JSON)
        source = Source(SourceKind.STREAMS, 0, f"{self.name} {user}")
        return Deferred(_stored_id(self._engine.submit([event], source=source)))

    async def _authenticate(self, sec: str | None) -> str:
        """A full check (scrypt) in the password thread, which only such checks use: a
        flood of wrong passwords queues there, never in front of consumers' work."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._password_checks, self._users.authenticate, sec)
        except StreamError as exc:
            self.refusals.record("", AUTHENTICATION, exc.description)
            raise

    async def _acknowledge(self, user: str, component: str, position: int) -> int:
        now, covers = await self._blocking(
            self._consumers.acknowledge, self.name, user, component, position
        )
        if covers is not None:
            await self._tell_group(user, component, covers)
        return now

    async def _tell_group(self, user: str, component: str, covers: Covers) -> None:
        """Write the consumer's registration and covers to the log, where the Syncer takes
        them to the other servers of the group (:mod:`..consumers.sync` applies them). The
        reply that acknowledged waits for it: once a consumer hears back, the group can know
        its position as soon as the Syncer has carried the event."""
        try:
            await self._engine.submit(
                [consumer_event(self._engine.server_id, self.name, user, component, covers)],
                source=Source(SourceKind.STREAMS, 0, self.name),
            )
        except (EngineError, StoreError) as exc:
            raise StreamError(
                INTERNAL_ERROR, f"stream {self.name}: cannot record the consumer: {exc}"
            ) from exc

    @contextlib.asynccontextmanager
    async def _lock(self, user: str, component: str) -> AsyncIterator[None]:
        """Hold the consumer's lock: its acknowledgements and session changes take turns.
        Dropped when unused, so that polls of unknown components leave nothing behind."""
        key = (user, component)
        lock = self._consumer_locks.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and self._consumer_locks.get(key) is lock:
                del self._consumer_locks[key]

    async def _blocking(self, function: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, function, *args)
        except StoreError as exc:
            raise StreamError(INTERNAL_ERROR, f"stream {self.name}: {exc}") from exc


async def _stored_id(stored: Awaitable[list[StoredEvent | None]]) -> str:
    """The id of an event ``addEvent`` submitted, once it is stored."""
    try:
        [event] = await stored
    except (EngineError, StoreError) as exc:
        raise StreamError(INTERNAL_ERROR, f"the event was not stored: {exc}") from exc
    if event is None:
        raise StreamError(INTERNAL_ERROR, "the event was not stored")
    return str(event.position)
