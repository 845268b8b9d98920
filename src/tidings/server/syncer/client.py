"""The Syncer's client side: keeping this store up to date with one peer's own events.

A :class:`SyncerClient` connects to one peer's syncer server, asks for the peer's own events
after the last one our store holds (``store.last_event_id(peer_server_id)``), stores them with
their own ids (:meth:`AsyncEngine.register_synced`), answers the flush handshake, and after
any disconnect or failure reconnects with a growing delay, resuming from the store's last id
of that server again: the store is the only cursor, so nothing is lost or stored twice. It
registers the ``('event', 'syncer', 'client', <peer>, 'synced')`` status event (see
:mod:`.common`) when its synced state changes.

It asks for the outbox ids (the mark on its ``clientName``, see :mod:`.common`): a tidings
peer then sends ``TidingsSyncer.MsgEvents``, and the store skips an event whose outbox
event it holds already (:meth:`EventStore.append_synced
<tidings.server.store.facade.EventStore.append_synced>`), so that an outbox event that
reached this server from the relay and from a peer is stored, notified and streamed once.
A hat-event peer sends plain ``HatSyncer.MsgEvents``, stored as they come.

An event the store cannot keep (a ``*`` type segment, an empty type, a bad outbox id; see
:func:`~tidings.server.syncer.common.sort_synced_events`) is skipped with an error naming
the peer, the event and why, and the rest of its batch is stored. The client then resumes
after the last event it skipped, if that is later than the store's last id of the peer
(events are sent in id order, and every earlier one was stored or skipped), so that a peer
whose last event is bad does not send it, and have it logged, on every reconnect. After a
restart the store is the cursor again, and such an event is skipped (and logged) once more.

The peer it is given is trusted: whoever names it has checked that its server id is not
our own and that its ``syncer_token`` matches ours, since ``HatSyncer.MsgReq`` has no token
field: the configuration (:mod:`tidings.config.server`) for static ``syncer_peers``, and
:mod:`tidings.server.monitor` for peers found in a Monitor Server's component data.
"""

from __future__ import annotations

import asyncio
import logging

from tidings.config.tls import TlsClientConfig
from tidings.errors import ConfigError, ConnectionClosed, ProtocolError, TidingsError
from tidings.events.model import EventId, StoredEvent, json_event
from tidings.events.sources import SYNCER_SOURCE
from tidings.server.async_engine import AsyncEngine
from tidings.server.syncer.common import (
    client_status_type,
    mark_client_name,
    sort_synced_events,
)
from tidings.wire import chatter, chatter_client, codec
from tidings.wire.chatter import Connection

log = logging.getLogger(__name__)

#: The messages that bring events: hat-event's, and the extension's with their outbox ids.
_EVENTS_MESSAGES = frozenset({(codec.SYNCER, "MsgEvents"), (codec.TIDINGS_SYNCER, "MsgEvents")})

#: Events of consecutive MsgEvents stored together at most (one session may exceed it).
MAX_SYNCED_BATCH = 10_000


class SyncerClient:
    """Keeps this store up to date with one peer server's own events.

    ``peer_server_id`` must be known: MsgReq names the server whose events are wanted, and
    the resume point is our store's last event of that server. The address and the id come
    checked (a ``syncer_peers`` entry, or a Monitor's component data) and are not checked
    again here (see the module docstring).
    """

    def __init__(
        self,
        address: str,
        engine: AsyncEngine,
        peer_server_id: int,
        *,
        client_name: str | None = None,
        min_delay: float = 0.5,
        max_delay: float = 5.0,
        connect_timeout: float = 5.0,
        ping_interval: float | None = chatter.DEFAULT_PING_INTERVAL,
        tls: TlsClientConfig | None = None,
    ) -> None:
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
        #: How an ``ssl+sbs://`` peer is verified, and the certificate we present to it.
        self._tls = tls
        self._synced = asyncio.Event()
        self._reported: bool | None = None
        self._connection: Connection | None = None
        #: The last event of the peer skipped after every earlier one was handled.
        self._skipped_to: EventId | None = None
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
        async with asyncio.timeout(timeout):
            await self._synced.wait()

    async def start(self) -> None:
        """Start connecting in the background (returns at once)."""
        if self._task is None:
            name = f"syncer client {self.address}"
            self._task = asyncio.create_task(self._run(), name=name)

    async def aclose(self) -> None:
        """Disconnect and stop reconnecting."""
        if self._task is not None:
            self._task.cancel()
            # wait() does not raise the task's cancellation, and so cannot swallow ours: a
            # caller cancelled meanwhile (a Monitor link closing) is cancelled still.
            await asyncio.wait([self._task])
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
                connection = await chatter_client.connect(
                    self.address,
                    tls=self._tls,
                    ping_interval=self._ping_interval,
                    timeout=self._connect_timeout,
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
        if self._skipped_to is not None and self._skipped_to > last:
            last = self._skipped_to
        request = {
            "lastEventId": codec.event_id_to_sbs(last),
            "clientName": mark_client_name(self.client_name),
        }
        connection.send(codec.SYNCER, "MsgReq", request)
        log.debug(
            "syncer client of server %d: asked for events after %s", self.peer_server_id, last
        )
        message: chatter.Message | None = None
        while True:
            if message is None:
                message = await connection.receive()
            kind = (message.module, message.type)
            following = None
            if kind in _EVENTS_MESSAGES:
                events, skipped, following = self._events_waiting(connection, message)
                if events and not self.synced:
                    await self._report(False)
                self._log_skipped(skipped)
                await self._engine.register_synced(events)
                self._skipped_past(skipped)
            elif kind == (codec.SYNCER, "MsgSynced"):
                self._synced.set()
                self._set_state("synced")
                await self._report(True)
            elif kind == (codec.SYNCER, "MsgFlushReq"):
                # Events received before it are stored by now: they are handled in order.
                connection.send(
                    codec.SYNCER, "MsgFlushRes", None, conversation=message.conversation, last=True
                )
                log.debug("syncer client of server %d: answered MsgFlushReq", self.peer_server_id)
            else:
                raise ProtocolError(
                    f"unexpected {message.module}.{message.type} from syncer server"
                )
            message = following

    @staticmethod
    def _events_waiting(
        connection: Connection, message: chatter.Message
    ) -> tuple[list[StoredEvent], list[tuple[EventId, str]], chatter.Message | None]:
        """The events of ``message`` and of the MsgEvents received right behind it, up to
        :data:`MAX_SYNCED_BATCH` (stored in one transaction: a peer that sends one session
        per message is followed at the store's batch speed, not one commit per session),
        the ids of those to skip and why, and the first other message already received,
        to be handled next, in order."""
        events, skipped = sort_synced_events(message.module, message.data)
        while len(events) + len(skipped) < MAX_SYNCED_BATCH:
            following = connection.receive_ready()
            if following is None:
                return events, skipped, None
            if (following.module, following.type) not in _EVENTS_MESSAGES:
                return events, skipped, following
            more, more_skipped = sort_synced_events(following.module, following.data)
            events += more
            skipped += more_skipped
        return events, skipped, None

    def _log_skipped(self, skipped: list[tuple[EventId, str]]) -> None:
        for event_id, reason in skipped:
            log.error(
                "syncer client of server %d at %s: synced event %s skipped: %s",
                self.peer_server_id,
                self.address,
                event_id,
                reason,
                extra={"peer": self.address, "event_id": str(event_id)},
            )

    def _skipped_past(self, skipped: list[tuple[EventId, str]]) -> None:
        """Once the events around them are stored, resume after the skipped ones."""
        ids = [event_id for event_id, _ in skipped if event_id.server == self.peer_server_id]
        if ids and (self._skipped_to is None or max(ids) > self._skipped_to):
            self._skipped_to = max(ids)

    async def _report(self, synced: bool) -> None:
        """Register the synced status event if it differs from the last one registered."""
        if self._reported == synced:
            return
        self._reported = synced
        try:
            await self._engine.register(
                [json_event(client_status_type(self.peer_server_id), synced)], SYNCER_SOURCE
            )
        except Exception as exc:
            log.warning(
                "syncer client of server %d: cannot register its status event: %r",
                self.peer_server_id,
                exc,
            )
