"""The Syncer of hat-event 0.8.5: copying one server's events to another, over chatter.

A :class:`SyncerServer` serves the events of this store to syncer clients (our
:class:`SyncerClient` in another tidings server, or a hat-event 0.8.5 server): a client opens
with ``HatSyncer.MsgReq {lastEventId, clientName}`` and gets every stored event of server
``lastEventId.server`` newer than that id, one ``MsgEvents`` per session, then ``MsgSynced``,
then the new events of that server as they are stored. As in hat-event, only events of the
requested server are sent, so a server passes on its own events (and whatever it holds of the
requested server), never a mix.

A :class:`SyncerClient` connects to one peer's syncer server, asks for the peer's own events
after the last one our store holds (``store.last_event_id(peer_server_id)``), stores them with
their own ids (:meth:`AsyncEngine.register_synced`), answers the flush handshake, and after
any disconnect or failure reconnects with a growing delay, resuming from the store's last id
of that server again: the store is the only cursor, so nothing is lost or stored twice.

Status events, as hat-event registers them (protocol notes §6, JSON payloads):

- ``('event', 'syncer', 'server')``: the list of ``{"client_name", "synced"}`` of the
  connected clients, registered when the server starts (``[]``) and on every change (a
  client sent its MsgReq, was sent MsgSynced, disconnected).
- ``('event', 'syncer', 'client', <peer server id>, 'synced')``: ``false`` when a connection
  receives events before MsgSynced (we were behind and are catching up), ``true`` on
  MsgSynced; registered only when the value differs from the last one registered, so a
  reconnect that finds nothing new registers nothing.

**Syncer token.** hat-event's ``syncer_token`` makes a server sync only with peers
configured with the same token; 0.8.5 checks it on the Monitor data, which tidings does not
implement, and ``HatSyncer.MsgReq`` has no token field, so a syncer server cannot check it on
the wire. tidings checks it where the peer is configured: a :class:`SyncerClient` is given
our own ``syncer_token`` and the token configured for the peer, and refuses to be created
unless they are equal (both absent counts as equal, as in hat-event). This guards against
syncing two installations by a configuration mistake; it is **not** authentication, and a
SyncerServer serves anyone who can connect to its port (as hat-event's does).

**Slow clients.** Live events are written to every synced client at once, from the loop, so
that neither the engine nor the other clients ever wait for one of them. A client with more
than ``max_unsent_bytes`` unsent (the socket's write buffer) that takes nothing for the
ping interval, or with four times that unsent, is disconnected with a logged reason; it
reconnects and resumes from its last stored id. The backlog, by contrast,
is sent at the client's pace (each chunk waits for the socket), since only that client waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tidings.address import parse_address
from tidings.errors import ConfigError, ConnectionClosed, ProtocolError, StoreError, TidingsError
from tidings.events.model import EventId, EventType, NewEvent, PayloadKind, StoredEvent
from tidings.server.async_engine import AsyncEngine
from tidings.wire import chatter, codec
from tidings.wire.chatter import Connection

log = logging.getLogger(__name__)

#: Type of the event listing the syncer server's clients.
SERVER_STATUS_TYPE: EventType = ("event", "syncer", "server")

_SYNCER = "HatSyncer"
#: Events read from the store per backlog query.
DEFAULT_BACKLOG_CHUNK = 1000
#: Live events held for a client still catching up; beyond that they are dropped and read
#: from the store again (they are stored before listeners hear of them).
DEFAULT_MAX_PENDING = 10_000
#: Unsent bytes that make a synced client count as stuck.
DEFAULT_MAX_UNSENT_BYTES = 16 * 1024 * 1024
#: How long a connection may stay silent before its MsgReq.
DEFAULT_REQUEST_TIMEOUT = 30.0
#: How long to wait for a client's MsgFlushRes when closing.
DEFAULT_FLUSH_TIMEOUT = 2.0


def client_status_type(peer_server_id: int) -> EventType:
    """Type of the event telling whether our client of ``peer_server_id`` is synced."""
    return ("event", "syncer", "client", str(peer_server_id), "synced")


def _json_event(event_type: EventType, value: object) -> NewEvent:
    return NewEvent(event_type, json.dumps(value).encode(), PayloadKind.JSON)


def _sessions(events: Sequence[StoredEvent]) -> list[list[StoredEvent]]:
    """Split ``events`` into runs of one (server, session): one MsgEvents each."""
    groups: list[list[StoredEvent]] = []
    for event in events:
        if groups and (groups[-1][0].id.server, groups[-1][0].id.session) == (
            event.id.server,
            event.id.session,
        ):
            groups[-1].append(event)
        else:
            groups.append([event])
    return groups


def _encode_events(events: Sequence[StoredEvent]) -> bytes:
    return codec.encode(_SYNCER, "MsgEvents", [codec.event_to_sbs(e) for e in events])


# --- server ---------------------------------------------------------------------------------


@dataclass(eq=False)
class _Client:
    """One syncer client of the server, from its MsgReq until it disconnects."""

    connection: Connection
    name: str
    #: The server whose events it asked for.
    server_id: int
    #: The last event id sent (or the client's own last id): later events only.
    last_sent: EventId
    synced: bool = False
    #: Backlog done: new events are written as they are stored.
    live: bool = False
    #: New events stored while the backlog is being sent.
    pending: list[StoredEvent] = field(default_factory=list)
    #: ``pending`` overflowed and was dropped: the backlog must read on.
    overflowed: bool = False


class SyncerServer:
    """Serves this store's events to syncer clients; create it with :meth:`start`."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        backlog_chunk: int,
        max_pending: int,
        max_unsent_bytes: int,
        request_timeout: float,
        flush_timeout: float,
        stall_seconds: float,
    ) -> None:
        self._engine = engine
        #: A client over max_unsent_bytes that takes nothing for this long is dropped.
        self._stall_seconds = stall_seconds
        self._backlog_chunk = backlog_chunk
        self._max_pending = max_pending
        self._max_unsent_bytes = max_unsent_bytes
        self._request_timeout = request_timeout
        self._flush_timeout = flush_timeout
        self._clients: list[_Client] = []
        self._handlers: set[asyncio.Task[object]] = set()
        self._status_lock = asyncio.Lock()
        self._closing = False
        self._server: chatter.Server | None = None
        self._unsubscribe: Callable[[], None] | None = None

    @classmethod
    async def start(
        cls,
        address: str,
        engine: AsyncEngine,
        *,
        backlog_chunk: int = DEFAULT_BACKLOG_CHUNK,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_unsent_bytes: int = DEFAULT_MAX_UNSENT_BYTES,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        flush_timeout: float = DEFAULT_FLUSH_TIMEOUT,
        ping_interval: float | None = chatter.DEFAULT_PING_INTERVAL,
    ) -> SyncerServer:
        """Listen on ``address`` (``tcp+sbs://HOST:PORT``, port 0 for any) and register the
        empty client list, as hat-event does when its syncer server starts."""
        for name, value in (
            ("backlog_chunk", backlog_chunk),
            ("max_pending", max_pending),
            ("max_unsent_bytes", max_unsent_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"syncer server: {name} must be a positive int, not {value!r}")
        self = cls(
            engine,
            backlog_chunk=backlog_chunk,
            max_pending=max_pending,
            max_unsent_bytes=max_unsent_bytes,
            request_timeout=request_timeout,
            flush_timeout=flush_timeout,
            stall_seconds=ping_interval or chatter.DEFAULT_PING_INTERVAL,
        )
        self._unsubscribe = engine.subscribe(self._on_stored)
        try:
            self._server = await chatter.listen(address, self._serve, ping_interval=ping_interval)
        except BaseException:
            self._unsubscribe()
            raise
        log.info("syncer server listening on %s (port %d)", address, self.port)
        await self._register_status()
        return self

    @property
    def port(self) -> int:
        """The bound port (useful after listening on port 0)."""
        assert self._server is not None
        return self._server.port

    @property
    def clients(self) -> list[tuple[str, bool]]:
        """``(client_name, synced)`` of each connected client, in connection order."""
        return [(client.name, client.synced) for client in self._clients]

    async def flush(self) -> None:
        """Ask every client to confirm it has processed what it was sent (MsgFlushReq).

        A client that does not answer within ``flush_timeout``, or disconnects, counts as
        done: flushing is a courtesy before closing, not a delivery guarantee.
        """
        await asyncio.gather(*(self._flush(client) for client in list(self._clients)))

    async def aclose(self) -> None:
        """Flush the clients, then close every connection and stop listening."""
        if self._closing:
            return
        self._closing = True
        await self.flush()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._server is not None:
            await self._server.aclose()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        log.info("syncer server closed")

    async def _flush(self, client: _Client) -> None:
        try:
            await client.connection.request(
                _SYNCER, "MsgFlushReq", None, timeout=self._flush_timeout
            )
        except TimeoutError:
            log.info(
                "syncer client %r (%s) did not answer MsgFlushReq within %s s",
                client.name,
                client.connection.peer,
                self._flush_timeout,
            )
        except ConnectionClosed:
            pass

    async def _serve(self, connection: Connection) -> None:
        """Serve one connection: MsgReq, backlog, MsgSynced, then live events."""
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            if self._closing:
                connection.close("syncer server is closing")
                return
            client = await self._accept(connection)
            if client is None:
                return
            self._clients.append(client)
            log.info(
                "syncer client %r connected from %s, asking for events of server %d after %s",
                client.name,
                connection.peer,
                client.server_id,
                client.last_sent,
            )
            try:
                await self._register_status()
                await self._send_backlog(client)
                await self._register_status()
                while True:
                    message = await connection.receive()
                    if (message.module, message.type) != (_SYNCER, "MsgFlushRes"):
                        break
                    # A reply that came after its flush timed out: harmless.
                connection.close(
                    f"unexpected {message.module}.{message.type} from syncer client {client.name!r}"
                )
            except StoreError as exc:
                connection.close(f"cannot serve syncer client {client.name!r}: {exc}")
            finally:
                self._clients.remove(client)
                connection.close()
                log.info(
                    "syncer client %r (%s) disconnected%s",
                    client.name,
                    connection.peer,
                    f": {connection.close_reason}" if connection.close_reason else "",
                )
                await self._register_status()
        finally:
            self._handlers.discard(task)

    async def _accept(self, connection: Connection) -> _Client | None:
        """The client of a connection's MsgReq; None (connection closed) if it sent another."""
        try:
            message = await asyncio.wait_for(connection.receive(), self._request_timeout)
        except TimeoutError:
            connection.close(f"no HatSyncer.MsgReq within {self._request_timeout} s")
            return None
        if (message.module, message.type) != (_SYNCER, "MsgReq"):
            connection.close(
                f"first message must be HatSyncer.MsgReq, not {message.module}.{message.type}"
            )
            return None
        try:
            last, name = _parse_request(message.data)
        except ProtocolError as exc:
            connection.close(f"invalid HatSyncer.MsgReq: {exc}")
            return None
        return _Client(connection, name, last.server, last)

    async def _send_backlog(self, client: _Client) -> None:
        """Send the stored events after the client's id, then MsgSynced, then go live.

        Live events stored meanwhile are held in ``client.pending`` (they are stored before
        listeners hear of them, so a held event that a later backlog read also returned is a
        duplicate and dropped by id). The switch to live happens without yielding to the
        loop after the last, short read, so no event falls between the two.
        """
        connection = client.connection
        store = self._engine.store
        while True:
            chunk = await self._engine.read(
                store.events_after, client.last_sent, self._backlog_chunk
            )
            groups = _sessions(chunk)
            full = len(chunk) >= self._backlog_chunk
            if full and len(groups) > 1:
                # The last session may go on in the next chunk: send it whole from there.
                groups.pop()
            for group in groups:
                self._send(client, group)
            await connection.drain()
            if full:
                continue
            if client.overflowed:
                # Held events were dropped: the store has them, read on.
                client.overflowed = False
                client.pending.clear()
                continue
            break
        connection.send(_SYNCER, "MsgSynced", None)
        pending = sorted(client.pending, key=lambda event: event.id)
        client.pending = []
        for group in _sessions(pending):
            self._send(client, group)
        client.live = True
        client.synced = True
        log.info("syncer client %r (%s) is synced", client.name, connection.peer)
        self._check_unsent(client)

    def _send(
        self, client: _Client, events: list[StoredEvent], encoded: bytes | None = None
    ) -> None:
        """Send the events of one session that are newer than what the client has."""
        if events[-1].id <= client.last_sent:
            return
        if events[0].id <= client.last_sent:
            events = [event for event in events if event.id > client.last_sent]
            encoded = None
        body = _encode_events(events) if encoded is None else encoded
        client.connection.send_encoded(_SYNCER, "MsgEvents", body)
        client.last_sent = events[-1].id

    def _check_unsent(self, client: _Client) -> None:
        """Drop a client that does not take what it is sent (the Eventer's rule, see
        :meth:`chatter.Connection.lagging`)."""
        reason = client.connection.lagging(
            self._max_unsent_bytes, self._stall_seconds, "max_unsent_bytes"
        )
        if reason is not None:
            client.connection.close(
                f"syncer client {client.name!r} is too slow: {reason}; it may reconnect and resume"
            )

    def _on_stored(self, events: list[StoredEvent]) -> None:
        """Engine listener (on the loop): hold or send each newly stored session."""
        if not self._clients:
            return
        groups = _sessions(events)
        encoded: dict[int, bytes] = {}
        for client in list(self._clients):
            if not client.connection.is_open:
                continue
            mine = [(i, g) for i, g in enumerate(groups) if g[0].id.server == client.server_id]
            if not mine:
                continue
            if not client.live:
                if not client.overflowed:
                    for _, group in mine:
                        client.pending.extend(group)
                    if len(client.pending) > self._max_pending:
                        client.pending.clear()
                        client.overflowed = True
                continue
            try:
                for index, group in mine:
                    if index not in encoded:
                        encoded[index] = _encode_events(group)
                    self._send(client, group, encoded[index])
            except ConnectionClosed:
                continue
            self._check_unsent(client)

    async def _register_status(self) -> None:
        """Register the client list as it is now; registrations keep the order of changes."""
        status = [{"client_name": client.name, "synced": client.synced} for client in self._clients]
        async with self._status_lock:
            try:
                await self._engine.register([_json_event(SERVER_STATUS_TYPE, status)])
            except Exception as exc:
                log.warning("syncer server: cannot register its status event: %r", exc)


def _parse_request(value: codec.Value) -> tuple[EventId, str]:
    last = codec.event_id_from_sbs(value["lastEventId"])
    name = value["clientName"]
    if last.server < 1 or last.session < 0 or last.instance < 0:
        raise ProtocolError(f"lastEventId: invalid id {last}")
    return last, name


# --- client ---------------------------------------------------------------------------------


class SyncerClient:
    """Keeps this store up to date with one peer server's own events.

    ``peer_server_id`` must be configured: MsgReq names the server whose events are wanted,
    and the resume point is our store's last event of that server. ``token`` is our own
    ``syncer_token`` and ``peer_token`` the one configured for the peer; they must be equal
    (see the module docstring).
    """

    def __init__(
        self,
        address: str,
        engine: AsyncEngine,
        peer_server_id: int,
        *,
        client_name: str | None = None,
        token: str | None = None,
        peer_token: str | None = None,
        min_delay: float = 0.5,
        max_delay: float = 5.0,
        connect_timeout: float = 5.0,
        ping_interval: float | None = chatter.DEFAULT_PING_INTERVAL,
    ) -> None:
        parse_address(address)
        if isinstance(peer_server_id, bool) or not isinstance(peer_server_id, int):
            raise ConfigError(
                f"syncer client: peer server id must be an int, not {peer_server_id!r}"
            )
        if peer_server_id < 1:
            raise ConfigError(
                f"syncer client: peer server id must be positive, not {peer_server_id}"
            )
        if peer_server_id == engine.server_id:
            raise ConfigError(
                f"syncer client of {address}: the peer's server id {peer_server_id} is our own; "
                "each server of a group needs its own server_id"
            )
        if token != peer_token:
            raise ConfigError(
                f"syncer client of {address} (server {peer_server_id}): the peer's syncer "
                "token does not match ours; servers only sync with peers of the same "
                "syncer_token"
            )
        if not 0 < min_delay <= max_delay:
            raise ConfigError(
                f"syncer client: need 0 < min_delay <= max_delay, not {min_delay}, {max_delay}"
            )
        self.address = address
        self.peer_server_id = peer_server_id
        self.client_name = str(engine.server_id) if client_name is None else client_name
        self._engine = engine
        self._min_delay = min_delay
        self._max_delay = max_delay
        self._connect_timeout = connect_timeout
        self._ping_interval = ping_interval
        self._synced = asyncio.Event()
        self._reported: bool | None = None
        self._connection: Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._state = "stopped"

    @property
    def synced(self) -> bool:
        """Connected and the peer has sent everything it had (MsgSynced)."""
        return self._synced.is_set()

    @property
    def connected(self) -> bool:
        return self._connection is not None and self._connection.is_open

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Wait until :attr:`synced` (TimeoutError after ``timeout`` seconds)."""
        await asyncio.wait_for(self._synced.wait(), timeout)

    async def start(self) -> None:
        """Start connecting in the background (returns at once)."""
        if self._task is None:
            name = f"syncer client {self.address}"
            self._task = asyncio.create_task(self._run(), name=name)

    async def aclose(self) -> None:
        """Disconnect and stop reconnecting."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._connection is not None:
            await self._connection.aclose()
            self._connection = None
        self._synced.clear()
        self._set_state("stopped")

    def _set_state(self, state: str, detail: str = "") -> None:
        """Log a change of connection state (repeated failures are logged once)."""
        if state == self._state:
            return
        self._state = state
        level = logging.WARNING if state == "unreachable" else logging.INFO
        log.log(
            level,
            "syncer client of server %d at %s: %s%s",
            self.peer_server_id,
            self.address,
            state,
            f" ({detail})" if detail else "",
        )

    async def _run(self) -> None:
        delay = self._min_delay
        while True:
            try:
                connection = await chatter.connect(
                    self.address, ping_interval=self._ping_interval, timeout=self._connect_timeout
                )
            except (OSError, TimeoutError) as exc:
                self._set_state(
                    "unreachable", f"{exc!r}; retrying every {self._max_delay} s at most"
                )
            else:
                self._connection = connection
                self._set_state("connected")
                reason = await self._session(connection)
                was_synced = self.synced
                self._synced.clear()
                await connection.aclose()
                self._connection = None
                self._set_state("disconnected", reason)
                if was_synced:
                    delay = self._min_delay
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_delay)

    async def _session(self, connection: Connection) -> str:
        """Sync over one connection until it ends; returns why it ended."""
        try:
            await self._sync(connection)
        except ConnectionClosed:
            return connection.close_reason or "closed by the peer"
        except TidingsError as exc:
            connection.close(str(exc))
            return str(exc)
        except Exception as exc:
            log.exception("syncer client of server %d failed", self.peer_server_id)
            connection.close(repr(exc))
            return repr(exc)
        return "closed"

    async def _sync(self, connection: Connection) -> None:
        last = await self._engine.read(self._engine.store.last_event_id, self.peer_server_id)
        request = {"lastEventId": codec.event_id_to_sbs(last), "clientName": self.client_name}
        connection.send(_SYNCER, "MsgReq", request)
        log.debug(
            "syncer client of server %d: asked for events after %s", self.peer_server_id, last
        )
        while True:
            message = await connection.receive()
            kind = (message.module, message.type)
            if kind == (_SYNCER, "MsgEvents"):
                events = codec.events_from_sbs(message.data, "MsgEvents")
                if events and not self.synced:
                    await self._report(False)
                await self._engine.register_synced(events)
            elif kind == (_SYNCER, "MsgSynced"):
                self._synced.set()
                self._set_state("synced")
                await self._report(True)
            elif kind == (_SYNCER, "MsgFlushReq"):
                # Events received before it are stored by now: they are handled in order.
                connection.send(
                    _SYNCER, "MsgFlushRes", None, conversation=message.conversation, last=True
                )
                log.debug("syncer client of server %d: answered MsgFlushReq", self.peer_server_id)
            else:
                raise ProtocolError(
                    f"unexpected {message.module}.{message.type} from syncer server"
                )

    async def _report(self, synced: bool) -> None:
        """Register the synced status event if it differs from the last one registered."""
        if self._reported == synced:
            return
        self._reported = synced
        try:
            await self._engine.register(
                [_json_event(client_status_type(self.peer_server_id), synced)]
            )
        except Exception as exc:
            log.warning(
                "syncer client of server %d: cannot register its status event: %r",
                self.peer_server_id,
                exc,
            )
