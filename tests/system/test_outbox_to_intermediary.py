"""The whole tidings chain into an intermediary: a service writes domain rows and their row
events through :class:`tidings.Outbox` into a real SQLite file, the real Spark relay
publishes them into a real event server process (its ``event_server`` target, a real
socket), and an intermediary served over WebSocket feeds subscribers from that server.

What it proves: the SQL view a subscriber sees equals the same SELECT run on the domain
tables in SQLite once the relay has delivered everything, round after round while the
service keeps writing; an event-type subscriber gets exactly the events of its type, in the
server's order, once each. No test asserts timings."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from bench.harness.processes import ServerProcess, free_port
from tests.support.chain_helpers import DDL, chain_rig, next_view, reference
from tests.support.helpers import relay_config, statuses
from tidings.client import QueryData, StoredEvent, connect, json_event
from tidings.db import make_engine
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.views.rows import emit_deleted, emit_row, row_event_type
from tidings.outbox.producer import Outbox
from tidings.pipeline.relay_query import start_relay

pytestmark = [pytest.mark.spark, pytest.mark.sockets]

VIEW = (
    "SELECT u.city, count(o.id) AS orders, sum(o.amount) AS total FROM users AS u "
    "JOIN orders AS o ON o.user_id = u.id WHERE o.amount > 20 GROUP BY u.city ORDER BY u.city"
)
PREFIX = ["db"]
WAIT = 120.0


@pytest.fixture
def server(tmp_path: Path):
    process = ServerProcess.tidings(
        tmp_path / "server", 1, {"eventer": free_port(), "syncer": free_port()}
    )
    process.start()
    yield process
    process.stop()


class Service:
    """A service writing its domain tables and, in the same transaction, their row events."""

    def __init__(self, outbox: Outbox, seed: int = 11) -> None:
        self.outbox = outbox
        self.rng = random.Random(seed)
        #: What it emitted for orders, in order: (key, row or None).
        self.orders: list[tuple[int, dict[str, Any] | None]] = []

    def write(self, table: str, key: int, row: dict[str, Any] | None) -> None:
        with self.outbox.transaction() as tx:
            tx.connection.execute(text(f"DELETE FROM {table} WHERE id = :id"), {"id": key})
            if row is None:
                emit_deleted(tx, table, key)
            else:
                columns = ", ".join(row)
                values = ", ".join(f":{c}" for c in row)
                tx.connection.execute(
                    text(f"INSERT INTO {table} ({columns}) VALUES ({values})"), row
                )
                emit_row(tx, table, key, row)
        if table == "orders":
            self.orders.append((key, row))

    def round(self, changes: int) -> None:
        for _ in range(changes):
            r = self.rng.random()
            if r < 0.3:
                uid = self.rng.randrange(20)
                city = self.rng.choice(["Oslo", "Lima", "Pune", "Kobe"])
                self.write("users", uid, {"id": uid, "name": f"u{uid}", "city": city})
            elif r < 0.85:
                oid = self.rng.randrange(60)
                amount = self.rng.randrange(1, 400) / 4
                self.write(
                    "orders", oid, {"id": oid, "user_id": self.rng.randrange(20), "amount": amount}
                )
            else:
                self.write(self.rng.choice(["users", "orders"]), self.rng.randrange(60), None)


def test_views_and_event_streams_through_outbox_spark_relay_event_server_and_intermediary(
    spark, server, tmp_path: Path
) -> None:
    target = {"kind": "event_server", "address": server.eventer, "type_prefix": PREFIX}
    routes = {row_event_type(t): ["remote"] for t in ("users", "orders")}
    config = relay_config(tmp_path, targets={"remote": target}, routes=routes)
    engine = make_engine(config.database.url)
    with engine.begin() as conn:
        for ddl in DDL:
            conn.exec_driver_sql(ddl)
    service = Service(Outbox(engine))
    domain = sqlite3.connect(tmp_path / "app.db")

    def relay() -> None:
        start_relay(spark, config, available_now=True).awaitTermination()
        assert set(statuses(engine).values()) == {"PUBLISHED"}

    async def settled(client: IntermediaryClient) -> list[list[Any]]:
        """Views until one equals the SELECT on the domain tables (bounded)."""
        expected = reference(domain, VIEW)
        while (view := await next_view(client, "v", WAIT))["rows"] != expected:
            pass
        return view["rows"]

    async def main() -> None:
        service.round(30)  # before the intermediary exists: its view starts from a load
        await asyncio.to_thread(relay)
        async with chain_rig(server.eventer, row_type_prefix=PREFIX) as rig:
            viewer = await rig.client()
            streamer = await rig.client()
            await streamer.subscribe_events("orders", [[*PREFIX, "rows.orders"]])
            streamed_from = len(service.orders)
            await viewer.subscribe_sql("v", VIEW, rate_hz=100)
            assert await settled(viewer)
            for _ in range(3):  # the service keeps writing; the view keeps up
                await asyncio.to_thread(service.round, 40)
                await asyncio.to_thread(relay)
                assert await settled(viewer) == reference(domain, VIEW)

            assert rig.views.bad_rows == 0
            async with await connect(server.eventer) as reader:
                # A last event of the type (deleting no row): a duplicate or an extra event
                # would come before it and break the equality below.
                sentinel = json_event((*PREFIX, "rows.orders"), {"key": -1, "deleted": True})
                await reader.register_with_response([sentinel])
                log: list[StoredEvent] = await reader.query(
                    QueryData(event_types=((*PREFIX, "rows.orders"),), order="ascending")
                )
            expected = log[-(len(service.orders) - streamed_from + 1) :]
            got = [await streamer.message(WAIT) for _ in expected]
            assert got[-1]["payload"] == {"key": -1, "deleted": True}
            got, expected = got[:-1], expected[:-1]
            assert [tuple(m["id"]) for m in got] == [
                (e.id.server, e.id.session, e.id.instance) for e in expected
            ]
            data = [m["payload"]["data"] for m in got]
            assert data == [json.loads(e.payload)["data"] for e in expected]
            # Per row, in the order the service wrote them (the relay keeps per-key order).
            emitted = service.orders[streamed_from:]
            for key in {k for k, _ in emitted}:
                assert [d.get("row") for d in data if d["key"] == key] == [
                    row for k, row in emitted if k == key
                ]
            await viewer.close()
            await streamer.close()

    asyncio.run(asyncio.wait_for(main(), 900))
