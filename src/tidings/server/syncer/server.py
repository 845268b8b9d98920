"""The Syncer's server side: serving this store's events to syncer clients.

A :class:`SyncerServer` serves the events of this store to syncer clients (our
:class:`~tidings.server.syncer.client.SyncerClient` in another tidings server, or a hat-event
0.8.5 server): a client opens with ``HatSyncer.MsgReq {lastEventId, clientName}`` and gets
every stored event of server ``lastEventId.server`` newer than that id, one ``MsgEvents``
per session, then ``MsgSynced``, then the new events of that server as they are stored. As
in hat-event, only events of the requested server are sent, so a server passes on its own
events (and whatever it holds of the requested server), never a mix. It registers the
``('event', 'syncer', 'server')`` status event (see :mod:`.common`) on every change of its
client list. A client whose ``clientName`` carries the outbox-ids mark (a tidings server,
see :mod:`.common`) is sent ``TidingsSyncer.MsgEvents``, which carry each event's outbox
id, in place of ``HatSyncer.MsgEvents``.

hat-event's ``syncer_token`` cannot be checked here: ``HatSyncer.MsgReq`` has no token
field, so a SyncerServer serves anyone who can connect to its port (as hat-event's does).
The token guards against syncing two installations by a configuration mistake, on the
client's side (see :mod:`tidings.config.server`); it is **not** authentication.

**Slow clients.** Live events are written to every synced client at once, from the loop, so
that neither the engine nor the other clients ever wait for one of them. A client with more
than ``max_unsent_bytes`` unsent (the socket's write buffer) that takes nothing for the
ping interval, or with four times that unsent, is disconnected with a logged reason; it
reconnects and resumes from its last stored id. The backlog, by contrast,
is sent at the client's pace (each chunk waits for the socket), since only that client waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tidings.accept import TOO_MANY_FROM_ADDRESS
from tidings.config.listener import ListenerLimitsConfig, limits_of
from tidings.config.server import require_positive_ints
from tidings.config.tls import TlsServerConfig
from tidings.errors import ConnectionClosed, ProtocolError, StoreError
from tidings.events.model import EventId, StoredEvent, json_event
from tidings.events.sources import SYNCER_SOURCE
from tidings.server.async_engine import AsyncEngine
from tidings.server.syncer.common import (
    SERVER_STATUS_TYPE,
    encode_outbox_events,
    parse_client_name,
)
from tidings.wire import chatter, chatter_server, codec
from tidings.wire.chatter import Connection

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncerLimits:
    """What a :class:`SyncerServer` holds for its clients and how long it waits for them."""

    #: Events read from the store per backlog query.
    backlog_chunk: int = 1000
    #: Live events held for a client still catching up; beyond that they are dropped and
    #: read from the store again (they are stored before listeners hear of them).
    max_pending: int = 10_000
    #: Unsent bytes that make a synced client count as stuck.
    max_unsent_bytes: int = 16 * 1024 * 1024
    #: How long a connection may stay silent before its MsgReq.
    request_timeout: float = 30.0
    #: How long to wait for a client's MsgFlushRes when closing.
    flush_timeout: float = 2.0


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


#: Clients that left remembered for the log's retention (see peer_needs), at most.
_PEERS_REMEMBERED = 1024


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
    #: It asked for the outbox ids (``TidingsSyncer.MsgEvents``).
    outbox_ids: bool = False

    def encode(self, events: Sequence[StoredEvent]) -> bytes:
        """The body of the events message this client is sent."""
        return encode_outbox_events(events) if self.outbox_ids else codec.encode_events(events)

    @property
    def events_module(self) -> str:
        """The module of the events message this client is sent."""
        return codec.TIDINGS_SYNCER if self.outbox_ids else codec.SYNCER


class SyncerServer:
    """Serves this store's events to syncer clients; create it with :meth:`start`."""

    def __init__(self, engine: AsyncEngine, limits: SyncerLimits, stall_seconds: float) -> None:
        self._engine = engine
        self._limits = limits
        #: A client over max_unsent_bytes that takes nothing for this long is dropped.
        self._stall_seconds = stall_seconds
        self._clients: list[_Client] = []
        #: The clients that left: the last id each was sent and when it left (monotonic).
        self._left: dict[str, tuple[EventId, float]] = {}
        self._handlers: set[asyncio.Task[object]] = set()
        self._status_lock = asyncio.Lock()
        self._closing = False
        self._server: chatter_server.Server | None = None
        self._unsubscribe: Callable[[], None] | None = None
        #: TLS handshakes refused (each logged; silent connections included), and connections
        #: closed at accept for their address's bound, for the metrics.
        self.refused_handshakes = 0
        self.refused_connections = 0

    def _refused_connection(self, reason: str) -> None:
        if reason == TOO_MANY_FROM_ADDRESS:
            self.refused_connections += 1
        else:
            self.refused_handshakes += 1

    @classmethod
    async def start(
        cls,
        address: str,
        engine: AsyncEngine,
        *,
        limits: SyncerLimits = SyncerLimits(),
        ping_interval: float | None = chatter.DEFAULT_PING_INTERVAL,
        tls: TlsServerConfig | None = None,
        accept: ListenerLimitsConfig | None = None,
    ) -> SyncerServer:
        """Listen on ``address`` (``tcp+sbs://HOST:PORT``, or ``ssl+sbs://`` with ``tls``;
        port 0 for any) and register the empty client list, as hat-event does when its syncer
        server starts. ``accept`` bounds the connections per client address and the TLS
        handshake (:mod:`tidings.accept`)."""
        require_positive_ints(
            "syncer server",
            backlog_chunk=limits.backlog_chunk,
            max_pending=limits.max_pending,
            max_unsent_bytes=limits.max_unsent_bytes,
        )
        self = cls(engine, limits, ping_interval or chatter.DEFAULT_PING_INTERVAL)
        self._unsubscribe = engine.subscribe(self._on_stored)
        try:
            self._server = await chatter_server.listen(
                address,
                self._serve,
                tls=None if tls is None else tls.context(),
                ping_interval=ping_interval,
                handshake_timeout=limits_of(accept).tls_handshake_timeout.total_seconds(),
                max_per_address=limits_of(accept).max_connections_per_address,
                on_refused=self._refused_connection,
            )
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

    def peer_needs(self, horizon_s: float) -> list[EventId]:
        """The last id sent to each client connected now or gone for at most ``horizon_s``
        seconds: each still needs the events after it (the log's retention spares them).
        Safe from another thread (it reads copies)."""
        now = time.monotonic()
        clients, left = list(self._clients), dict(self._left)
        connected = {c.name for c in clients}
        return [c.last_sent for c in clients] + [
            last
            for name, (last, since) in left.items()
            if name not in connected and now - since <= horizon_s
        ]

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
                codec.SYNCER, "MsgFlushReq", None, timeout=self._limits.flush_timeout
            )
        except TimeoutError:
            log.info(
                "syncer client %r (%s) did not answer MsgFlushReq within %s s",
                client.name,
                client.connection.peer,
                self._limits.flush_timeout,
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
                    if (message.module, message.type) != (codec.SYNCER, "MsgFlushRes"):
                        break
                    # A reply that came after its flush timed out: harmless.
                connection.close(
                    f"unexpected {message.module}.{message.type} from syncer client {client.name!r}"
                )
            except StoreError as exc:
                connection.close(f"cannot serve syncer client {client.name!r}: {exc}")
            finally:
                self._clients.remove(client)
                self._left.pop(client.name, None)  # re-inserted last: the newest
                self._left[client.name] = (client.last_sent, time.monotonic())
                if len(self._left) > _PEERS_REMEMBERED:  # the one gone longest goes
                    del self._left[next(iter(self._left))]
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
            async with asyncio.timeout(self._limits.request_timeout):
                message = await connection.receive()
        except TimeoutError:
            connection.close(f"no HatSyncer.MsgReq within {self._limits.request_timeout} s")
            return None
        if (message.module, message.type) != (codec.SYNCER, "MsgReq"):
            connection.close(
                f"first message must be HatSyncer.MsgReq, not {message.module}.{message.type}"
            )
            return None
        try:
            last, sent_name = _parse_request(message.data)
        except ProtocolError as exc:
            connection.close(f"invalid HatSyncer.MsgReq: {exc}")
            return None
        name, outbox_ids = parse_client_name(sent_name)
        return _Client(connection, name, last.server, last, outbox_ids=outbox_ids)

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
                store.events_after, client.last_sent, self._limits.backlog_chunk
            )
            groups = _sessions(chunk)
            full = len(chunk) >= self._limits.backlog_chunk
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
        connection.send(codec.SYNCER, "MsgSynced", None)
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
        body = client.encode(events) if encoded is None else encoded
        client.connection.send_encoded(client.events_module, "MsgEvents", body)
        client.last_sent = events[-1].id

    def _check_unsent(self, client: _Client) -> None:
        """Drop a client that does not take what it is sent (the Eventer's rule, see
        :meth:`chatter.Connection.lagging`)."""
        reason = client.connection.lagging(
            self._limits.max_unsent_bytes, self._stall_seconds, "max_unsent_bytes"
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
        #: By session index and whether with outbox ids: encoded once for all clients.
        encoded: dict[tuple[int, bool], bytes] = {}
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
                    if len(client.pending) > self._limits.max_pending:
                        client.pending.clear()
                        client.overflowed = True
                continue
            try:
                for index, group in mine:
                    key = (index, client.outbox_ids)
                    if key not in encoded:
                        encoded[key] = client.encode(group)
                    self._send(client, group, encoded[key])
            except ConnectionClosed:
                continue
            self._check_unsent(client)

    async def _register_status(self) -> None:
        """Register the client list as it is now; registrations keep the order of changes."""
        status = [{"client_name": client.name, "synced": client.synced} for client in self._clients]
        async with self._status_lock:
            try:
                await self._engine.register([json_event(SERVER_STATUS_TYPE, status)], SYNCER_SOURCE)
            except Exception as exc:
                log.warning("syncer server: cannot register its status event: %r", exc)


def _parse_request(value: codec.Value) -> tuple[EventId, str]:
    last = codec.event_id_from_sbs(value["lastEventId"])
    name = value["clientName"]
    if last.server < 1 or last.session < 0 or last.instance < 0:
        raise ProtocolError(f"lastEventId: invalid id {last}")
    return last, name
