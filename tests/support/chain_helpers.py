"""Shared by the tidings-chain tests: an intermediary served over WebSocket whose event and
SQL subscriptions are fed by a real event server through :class:`TidingsChain`, with a tap
that records what the chain handed over (the real chain, only observed)."""

from __future__ import annotations

import sqlite3
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from tests.support.intermediary_helpers import WORLD
from tidings.client import QueryType
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.node.intermediary import Intermediary
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.serving.access import Gatekeeper
from tidings.intermediary.serving.transport import IntermediaryServer, TransportLimits
from tidings.intermediary.views.event_server_upstream import TidingsChain
from tidings.intermediary.views.eventviews import DEFAULT_WORKERS, EventViews
from tidings.intermediary.views.messages import ChainBatch
from tidings.intermediary.views.sqlviews import Catalog, SqlLimits

#: The domain tables of the tests' service, as the catalog allows them.
CATALOG = Catalog.from_mapping(
    {
        "users": {"id": "integer", "name": "text", "city": "text", "age": "integer"},
        "orders": {"id": "integer", "user_id": "integer", "amount": "real"},
    },
    keys={"users": "id", "orders": "id"},
)
DDL = (
    "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT, city TEXT, age INTEGER)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, user_id INTEGER, amount REAL)",
)


class Tap:
    """The real chain, with every batch it handed over recorded."""

    def __init__(self, chain: TidingsChain) -> None:
        self.chain = chain
        self.batches: list[ChainBatch] = []
        self.updates: list[tuple[tuple[QueryType, ...], dict[str, QueryType]]] = []

    async def update(self, patterns: Sequence[QueryType], tables: Mapping[str, QueryType]) -> None:
        self.updates.append((tuple(patterns), dict(tables)))
        await self.chain.update(patterns, tables)

    async def loaded(self, tables: Iterable[str]) -> None:
        await self.chain.loaded(tables)

    def take(self) -> list[ChainBatch]:
        batches = self.chain.take()
        self.batches.extend(batches)
        return batches

    def event_types(self) -> list[tuple[str, ...]]:
        return [e.type for b in self.batches for e in b.events]


class ChainRig:
    def __init__(self, server: IntermediaryServer, views: EventViews, tap: Tap) -> None:
        self.server = server
        self.views = views
        self.tap = tap

    @property
    def url(self) -> str:
        return f"{self.server.scheme}://127.0.0.1:{self.server.port}/"

    async def client(self, **options: Any) -> IntermediaryClient:
        """A subscriber (``options``: :meth:`IntermediaryClient.connect`'s)."""
        return await IntermediaryClient.connect(self.url, **options)


@asynccontextmanager
async def chain_rig(
    address: str,
    *,
    row_type_prefix: Sequence[str] = (),
    limits: TransportLimits | None = None,
    sql_limits: SqlLimits | None = None,
    access: Gatekeeper | None = None,
    tls: ssl.SSLContext | None = None,
    host: str = "127.0.0.1",
    chain: TidingsChain | None = None,
    view_workers: int = DEFAULT_WORKERS,
) -> AsyncIterator[ChainRig]:
    """An intermediary on a free port of ``host``, chained to the event server at
    ``address`` (``access``, ``tls``: as :class:`IntermediaryServer` takes them; ``chain``:
    a chain to it not started yet, instead of a plain one)."""
    chain = chain or TidingsChain(address)
    await chain.start()
    tap = Tap(chain)
    views = EventViews(
        tap, CATALOG, row_type_prefix=row_type_prefix, limits=sql_limits, workers=view_workers
    )
    spatial = Intermediary(2, Simulation(0, WORLD).feed(), world=WORLD)
    server = IntermediaryServer(
        spatial,
        views=views,
        tick_s=0.01,
        limits=limits,
        upstreams=lambda: {"event_server": chain.staleness},
        access=access,
        tls=tls,
    )
    await server.start(host)
    try:
        yield ChainRig(server, views, tap)
    finally:
        await server.aclose()
        await chain.aclose()


async def next_view(client: IntermediaryClient, key: str, timeout: float = 30.0) -> dict[str, Any]:
    """The next view message of ``key`` with rows (``unchanged`` ones skipped)."""
    while True:
        message = await client.message(timeout)
        if message["op"] == "view" and message["key"] == key and "rows" in message:
            return message


def reference(db: sqlite3.Connection, sql: str) -> list[list[Any]]:
    """The SELECT run on the domain tables themselves."""
    return [list(r) for r in db.execute(sql).fetchall()]
