"""The tidings chain upstream: an intermediary fed by the event server.

:class:`TidingsChain` is one connection of the public client (:mod:`tidings.client`, the Hat
Eventer protocol) to the event server. It implements
:class:`~tidings.intermediary.views.eventviews.ChainUpstream`: :meth:`TidingsChain.update`
replaces the server's subscription with the intermediary's pattern set, and a background
task receives notifications and queues them as :class:`~.eventviews.ChainBatch` es that
:meth:`TidingsChain.take` hands over, one epoch's worth at a time.

Initial state. A table newly folded is loaded with a query (all its row events, oldest
first) *after* the subscription that includes its row type: an event committed meanwhile is
then in the query's answer, in the notifications, or in both, never in neither. Its row
events notified while the load is under way are held; when the answer comes, the load and
the held events newer than the answer's newest (event ids grow in the server's order) go out
as one batch, and from then on a row event of that table is folded only when it is newer
than the load's newest, so nothing is folded twice or out of order.

A request on the connection is answered only after the server took every message sent
before it, so after a change of subscription a small query serves as a barrier:
:meth:`TidingsChain.update` returns when the server delivers by the new set.

Backpressure: at most ``max_batches`` batches wait for :meth:`take`; past that the task stops
receiving, and the server, whose notifications then queue, drops the connection as a slow
subscriber (it is a bug in the caller, who takes every tick). The connection is not
re-established after a loss (:attr:`TidingsChain.closed` says why).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping, Sequence

from tidings.client import (
    Client,
    ConnectionClosed,
    EventId,
    QueryData,
    QueryType,
    StoredEvent,
    connect,
)
from tidings.errors import IntermediaryError, TidingsError
from tidings.intermediary.views.eventviews import ChainBatch
from tidings.tasks import stop_task

log = logging.getLogger(__name__)


class TidingsChain:
    """Upstream of :class:`~.eventviews.EventViews` over an event server at ``address``
    (``tcp+sbs://host:port``). :meth:`start`, then :meth:`aclose`."""

    def __init__(
        self, address: str, *, max_batches: int = 10_000, request_timeout: float = 30.0
    ) -> None:
        self.address = address
        self.max_batches = max_batches
        self.request_timeout = request_timeout
        #: Why the connection ended (None while it is open).
        self.closed: str | None = None
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._inbox: deque[ChainBatch] = deque()
        self._room = asyncio.Event()
        self._room.set()
        #: row type -> table, for the tables folded (loading or live).
        self._types: dict[QueryType, str] = {}
        #: Held row events of tables being loaded.
        self._loading: dict[str, list[StoredEvent]] = {}
        #: The newest event id of each live table's load (None: the load was empty).
        self._floors: dict[str, EventId | None] = {}

    async def start(self) -> None:
        try:
            self._client = await connect(self.address, request_timeout=self.request_timeout)
        except (OSError, TidingsError) as exc:
            raise IntermediaryError(f"chain: cannot connect to {self.address}: {exc}") from exc
        self._task = asyncio.get_running_loop().create_task(self._receive())

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
        if self._client is not None:
            await self._client.aclose()

    def take(self) -> list[ChainBatch]:
        batches = list(self._inbox)
        self._inbox.clear()
        self._room.set()
        return batches

    async def update(self, patterns: Sequence[QueryType], tables: Mapping[str, QueryType]) -> None:
        client = self._client
        if client is None or self.closed is not None:
            raise IntermediaryError(f"chain: not connected ({self.closed or 'not started'})")
        new = {t: ty for t, ty in tables.items() if t not in self._types.values()}
        for table in set(self._types.values()) - set(tables):
            self._floors.pop(table, None)
            self._loading.pop(table, None)
        for table in new:
            self._loading[table] = []
        self._types = {ty: t for t, ty in tables.items()}
        try:
            await client.subscribe(list(patterns))
            for table, row_type in new.items():
                loaded = await client.query(QueryData(event_types=(row_type,), order="ascending"))
                floor = max((e.id for e in loaded), default=None)
                held = [e for e in self._loading.pop(table) if floor is None or e.id > floor]
                self._floors[table] = floor
                self._inbox.append(ChainBatch(rows={table: (*loaded, *held)}))
            if not new:  # the barrier: answered once the subscription is taken
                await client.query(QueryData(max_results=0))
        except TidingsError as exc:
            for table in new:
                self._loading.pop(table, None)
                self._floors.pop(table, None)
            self._types = {ty: t for ty, t in self._types.items() if t not in new}
            raise IntermediaryError(f"chain: {exc}") from exc

    async def _receive(self) -> None:
        assert self._client is not None
        try:
            while True:
                await self._room.wait()
                events = await self._client.receive()
                rows: dict[str, list[StoredEvent]] = {}
                for event in events:
                    table = self._types.get(event.type)
                    if table is None:
                        continue
                    if table in self._loading:
                        self._loading[table].append(event)
                    elif (floor := self._floors.get(table)) is None or event.id > floor:
                        rows.setdefault(table, []).append(event)
                self._inbox.append(
                    ChainBatch(tuple(events), {t: tuple(e) for t, e in rows.items()})
                )
                if len(self._inbox) >= self.max_batches:
                    self._room.clear()
        except (ConnectionClosed, TidingsError) as exc:
            self.closed = str(exc) or type(exc).__name__
            log.error("intermediary chain to %s closed: %s", self.address, self.closed)
