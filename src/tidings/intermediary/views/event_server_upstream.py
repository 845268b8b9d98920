"""The tidings chain upstream: an intermediary fed by the event server (or by any server of a
redundant group).

:class:`TidingsChain` is a connection of the public client (:mod:`tidings.client`, the Hat
Eventer protocol) to one of the group's addresses. It implements
:class:`~tidings.intermediary.views.messages.ChainUpstream`: :meth:`TidingsChain.update`
replaces the server's subscription with the intermediary's pattern set, and a background
task receives notifications and queues them as :class:`~.messages.ChainBatch` es that
:meth:`TidingsChain.take` hands over, one epoch's worth at a time.

Initial state. A table newly folded is loaded with a query *after* the subscription that
includes its row type; meanwhile that table's row events are held (the notifications go on
to everyone else: a large table's load stalls no event subscriber): an event committed
meanwhile is then in the query's answer, in the held row events, or in both, never in
neither. The load runs on its own, outside the lock that orders the changes of subscription,
so another subscriber's change waits for no load; :meth:`TidingsChain.loaded` waits for it.
The load is
the newest row event of every key (:meth:`tidings.client.Client.query_latest_by_key`, a
tidings extension the server answers from its store), so it costs the table's size, not its
history. Its newest event ids are the table's floor (a
:class:`~.resync.Watermark`): a row event is folded only if it is past the floor, so nothing is
folded twice.

Losing the server. When the connection ends the chain is *stale* (:attr:`TidingsChain.stale`
says why) and the intermediary goes on serving what it holds. It tries the addresses in turn,
waiting by a :class:`~tidings.tasks.Backoff` after each round that reached none; once one
answers it subscribes again and asks for every event of its patterns since the
:class:`~.resync.Watermark`'s time (in pages: a long outage may have a backlog larger than
one reply may be), holding notifications meanwhile, and hands over only
events past the mark (the same mark every notification passes). Subscriptions changed while
stale are taken and recorded, and tables added meanwhile are loaded then. Only then is it
fresh again. So subscribers see every event once, in order, and views converge, without
re-subscribing.

A request on the connection is answered only after the server took every message sent
before it, so after a change of subscription a small query serves as a barrier:
:meth:`TidingsChain.update` returns when the server delivers by the new set.

Backpressure: at most ``max_batches`` batches wait for :meth:`take`; past that the task stops
receiving, and the server, whose notifications then queue, drops the connection as a slow
subscriber (it is a bug in the caller, who takes every tick); the chain then resynchronises.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from tidings.client import Client, ConnectionClosed, QueryData, QueryType, StoredEvent, connect
from tidings.config.tls import TlsClientConfig
from tidings.errors import IntermediaryError, TidingsError
from tidings.intermediary.staleness import Staleness
from tidings.intermediary.views.messages import ChainBatch
from tidings.intermediary.views.resync import Watermark
from tidings.tasks import Backoff, stop_task

log = logging.getLogger(__name__)


class TidingsChain:
    """Upstream of :class:`~.eventviews.EventViews` over an event server at ``addresses``
    (``tcp+sbs://host:port`` or ``ssl+sbs://`` with ``tls``, one or the servers of a group,
    tried in turn). :meth:`start`, then :meth:`aclose`."""

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        max_batches: int = 10_000,
        request_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        backoff: Backoff | None = None,
        tls: TlsClientConfig | None = None,
    ) -> None:
        self.addresses = (addresses,) if isinstance(addresses, str) else tuple(addresses)
        if not self.addresses:
            raise IntermediaryError("chain: expected at least one event server address")
        #: The address connected to (or last connected to).
        self.address = self.addresses[0]
        self.max_batches = max_batches
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.backoff = backoff or Backoff()
        #: How servers at ``ssl+sbs://`` addresses are verified (None: the system's CAs).
        self.tls = tls
        #: Why the chain is not fresh, and each change of it (see :attr:`stale`).
        self.staleness = Staleness("not started")
        #: How many times it reconnected and resynchronised.
        self.resyncs = 0
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._receiver: asyncio.Task[str] | None = None
        self._lock = asyncio.Lock()
        self._inbox: deque[ChainBatch] = deque()
        self._room = asyncio.Event()
        self._room.set()
        #: Notifications held while a load or a resynchronisation is under way.
        self._holding: list[StoredEvent] | None = None
        self._seen = Watermark()
        self._patterns: tuple[QueryType, ...] = ()
        #: row type -> table, for the tables folded (loaded or not yet).
        self._types: dict[QueryType, str] = {}
        #: Each loaded table's floor; a table without one waits for its load.
        self._floors: dict[str, Watermark] = {}
        #: The loads under way, by table, and the row events each holds meanwhile.
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._held_rows: dict[str, list[StoredEvent]] = {}

    @property
    def stale(self) -> str | None:
        """Why the chain is not fresh (None while connected and in sync)."""
        return self.staleness.why

    async def start(self) -> None:
        """Connect to the first address that answers; none answering is an error here (a
        loss later is ridden out)."""
        self._client = await self._connect_any()
        self.staleness.fresh()
        self._task = asyncio.get_running_loop().create_task(self._run(self._client))

    async def aclose(self) -> None:
        for load in list(self._loads.values()):
            await stop_task(load)
        if self._task is not None:
            await stop_task(self._task)
        if self._receiver is not None:
            await stop_task(self._receiver)
        if self._client is not None:
            await self._client.aclose()
        self.staleness.lost("closed")

    def take(self) -> list[ChainBatch]:
        batches = list(self._inbox)
        self._inbox.clear()
        self._room.set()
        return batches

    async def update(self, patterns: Sequence[QueryType], tables: Mapping[str, QueryType]) -> None:
        async with self._lock:
            old = (self._patterns, dict(self._types), dict(self._floors))
            self._patterns = tuple(patterns)
            self._types = {ty: t for t, ty in tables.items()}
            self._floors = {t: f for t, f in self._floors.items() if t in tables}
            for table in [t for t in self._loads if t not in tables]:  # dropped meanwhile
                self._loads.pop(table).cancel()
                self._held_rows.pop(table, None)
            client = self._client
            if client is None:  # stale: taken now, done when the server is back
                return
            try:
                await client.subscribe(list(self._patterns))
                await client.query(QueryData(max_results=0))  # the barrier
            except ConnectionClosed:  # lost meanwhile: the resynchronisation will do it
                return
            except TidingsError as exc:
                self._patterns, self._types, self._floors = old
                raise IntermediaryError(f"chain: {exc}") from exc
            for row_type, table in self._types.items():
                if table not in self._floors and table not in self._loads:
                    self._held_rows[table] = []
                    load = asyncio.get_running_loop().create_task(
                        self._load(client, table, row_type)
                    )
                    load.add_done_callback(_failed_load)
                    self._loads[table] = load

    async def loaded(self, tables: Iterable[str]) -> None:
        """Return once ``tables`` are loaded (their rows queued for :meth:`take`), or at once
        for those not being loaded (stale: loaded when the server is back); an
        :class:`IntermediaryError` if a load failed for another reason than the connection
        lost (then resynchronising loads it)."""
        for table in tables:
            load = self._loads.get(table)
            if load is None:
                continue
            await asyncio.wait({load})
            failure = None if load.cancelled() else load.exception()
            if isinstance(failure, TidingsError) and not isinstance(failure, ConnectionClosed):
                raise IntermediaryError(f"chain: loading table {table}: {failure}") from failure
            if failure is not None and not isinstance(failure, TidingsError):
                raise failure

    async def _load(self, client: Client, table: str, row_type: QueryType) -> None:
        """Load ``table`` (newest row event per key), then queue it with the row events held
        meanwhile that are past its floor."""
        held: list[StoredEvent] = []
        try:
            loaded = await client.query_latest_by_key(row_type)
        finally:
            if self._loads.get(table) is asyncio.current_task():  # not dropped meanwhile
                del self._loads[table]
                held = self._held_rows.pop(table, [])
        if table in self._floors:
            return  # loaded by a resynchronisation meanwhile
        floor = Watermark()
        floor.take(loaded)
        self._floors[table] = floor
        newer = [event for event in held if floor.is_new(event.id)]
        self._inbox.append(ChainBatch(rows={table: (*loaded, *newer)}))

    # -- the connection ----------------------------------------------------------------

    async def _apply(self, client: Client, *, since_us: int) -> None:
        """Resynchronise: subscribe ``client`` to the patterns, load the tables not loaded
        yet and catch up from ``since_us``, the notifications held meanwhile."""
        unloaded = [(t, ty) for ty, t in self._types.items() if t not in self._floors]
        self._holding = []
        try:
            await client.subscribe(list(self._patterns))
            missed: list[StoredEvent] = []
            if self._patterns:
                query = QueryData(event_types=self._patterns, t_from=since_us, order="ascending")
                missed = [e async for page in client.query_pages(query) for e in page]
            for table, row_type in unloaded:
                loaded = await client.query_latest_by_key(row_type)
                floor = Watermark()
                floor.take(loaded)
                self._floors[table] = floor
                self._held_rows.pop(table, None)
                self._inbox.append(ChainBatch(rows={table: tuple(loaded)}))
            self._deliver(missed)
            self._deliver(self._holding)
        finally:
            self._holding = None

    async def _connect_any(self) -> Client:
        """One round over the addresses, from the one last used."""
        start = self.addresses.index(self.address)
        errors = []
        for address in self.addresses[start:] + self.addresses[:start]:
            try:
                client = await connect(
                    address,
                    tls=self.tls,
                    timeout=self.connect_timeout,
                    request_timeout=self.request_timeout,
                )
            except (OSError, TimeoutError, TidingsError) as exc:
                errors.append(f"{address}: {exc or type(exc).__name__}")
                continue
            self.address = address
            return client
        if len(errors) == 1:
            raise IntermediaryError(f"chain: cannot connect to {errors[0]}")
        raise IntermediaryError(f"chain: cannot connect to any event server: {'; '.join(errors)}")

    async def _run(self, client: Client) -> None:
        """Receive from ``client``; when it is lost, reconnect and resynchronise, forever."""
        self._receiver = asyncio.get_running_loop().create_task(self._receive(client))
        while True:
            self.staleness.lost(await self._receiver)
            lost_at_us = time.time_ns() // 1000
            self._client = None
            log.warning(
                "intermediary chain to %s lost: %s; serving stale state, reconnecting",
                self.address,
                self.stale,
            )
            await client.aclose()
            client, self._receiver = await self._resync(lost_at_us)

    async def _resync(self, lost_at_us: int) -> tuple[Client, asyncio.Task[str]]:
        """Reconnect (with backoff) and catch up; the new connection, fresh, and its
        receiving task (started before the subscription, so nothing is left unread)."""
        while True:
            try:
                client = await self._connect_any()
            except IntermediaryError as exc:
                delay = self.backoff.next_delay()
                log.info("intermediary chain: %s; next try in %.2f s", exc, delay)
                await asyncio.sleep(delay)
                continue
            self._receiver = receiver = asyncio.get_running_loop().create_task(
                self._receive(client)
            )
            try:
                async with self._lock:
                    await self._apply(client, since_us=self._seen.since(lost_at_us))
                    self._client = client
            except TidingsError as exc:
                log.warning("intermediary chain: resynchronising from %s: %s", self.address, exc)
                await stop_task(receiver)
                await client.aclose()
                await asyncio.sleep(self.backoff.next_delay())
                continue
            self.backoff.reset()
            self.resyncs += 1
            self.staleness.fresh()
            log.warning("intermediary chain: resynchronised from %s", self.address)
            return client, receiver

    async def _receive(self, client: Client) -> str:
        """Take notifications until the connection ends; why it ended."""
        try:
            while True:
                await self._room.wait()
                events = await client.receive()
                if self._holding is not None:
                    self._holding.extend(events)
                else:
                    self._deliver(events)
                    if len(self._inbox) >= self.max_batches:
                        self._room.clear()
        except (ConnectionClosed, TidingsError) as exc:
            return str(exc) or type(exc).__name__

    def _deliver(self, events: Sequence[StoredEvent]) -> None:
        """Queue the events past the mark as one batch, with the row events to fold (those
        of loaded tables, past the table's floor)."""
        fresh = self._seen.take(events)
        if not fresh:
            return
        rows: dict[str, list[StoredEvent]] = {}
        for event in fresh:
            table = self._types.get(event.type)
            if table is None:
                continue
            floor = self._floors.get(table)
            if floor is not None and floor.is_new(event.id):
                rows.setdefault(table, []).append(event)
            elif table in self._held_rows:  # its load is under way
                self._held_rows[table].append(event)
        self._inbox.append(ChainBatch(tuple(fresh), {t: tuple(e) for t, e in rows.items()}))


def _failed_load(load: asyncio.Task[None]) -> None:
    """Log a load that failed (its waiters, if any, are told too; a connection lost is the
    resynchronisation's to mend)."""
    if load.cancelled():
        return
    failure = load.exception()
    if failure is not None and not isinstance(failure, ConnectionClosed):
        log.warning("intermediary chain: a table's load failed: %s", failure)
