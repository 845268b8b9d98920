"""One subscriber's expensive SQL view stalls no other subscriber (issue 30), through a real
event server, the real chain and real subscribers: neither a view under evaluation (the
views have more than one worker) nor a table being loaded for a new view holds another
subscriber's subscribe or its events. No test asserts timings: waits are bounded only so
that a broken build fails instead of hanging."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.support.chain_helpers import chain_rig, next_view
from tests.support.server_helpers import running
from tidings.client import Client, QueryType, StoredEvent, connect, json_event
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.views.event_server_upstream import TidingsChain
from tidings.intermediary.views.sqlviews import SqlLimits

pytestmark = pytest.mark.sockets

WAIT = 60.0
USERS = 60
#: Five copies of 60 users joined: 777 million rows to count, far past the test.
EXPENSIVE = (
    "SELECT count(*) AS n FROM users a CROSS JOIN users b CROSS JOIN users c "
    "CROSS JOIN users d CROSS JOIN users e"
)


async def _users(producer: Client, count: int) -> None:
    events = [
        json_event(("rows.users",), {"key": i, "row": {"id": i, "name": f"u{i}", "age": 30}})
        for i in range(count)
    ]
    assert all(await producer.register_with_response(events))


async def _event(client: IntermediaryClient, key: str) -> dict[str, Any]:
    while True:
        message = await client.message(WAIT)
        if message["op"] == "event" and message["key"] == key:
            return message


def test_a_view_evaluated_to_its_bounds_leaves_the_others_served(tmp_path: Path) -> None:
    """While one subscriber's view is being evaluated (it would run for 10 s), another
    subscribes to a view and to events, and gets both."""

    async def main() -> None:
        limits = SqlLimits(max_steps=10**15, timeout_s=10.0)
        async with (
            running(tmp_path) as srv,
            chain_rig(srv.address, sql_limits=limits, view_workers=2) as rig,
            await connect(srv.address) as producer,
        ):
            await _users(producer, USERS)
            heavy, other = await rig.client(), await rig.client()
            await heavy.subscribe_sql("heavy", EXPENSIVE)
            running_views = rig.views._running  # the worker's evaluations under way
            await _until(lambda: any(not r.running.done() for r in running_views.values()
                                     if r.running is not None))  # fmt: skip
            await other.subscribe_sql("n", "SELECT count(*) AS n FROM users")
            await other.subscribe_events("e", [["app", "*"]])
            await producer.register_with_response([json_event(("app", "x"), {"i": 1})])
            assert (await _event(other, "e"))["payload"] == {"i": 1}
            assert (await next_view(other, "n", WAIT))["rows"] == [[USERS]]
            evaluating = [r for r in running_views.values() if r.running is not None]
            assert evaluating and not evaluating[0].running.done()  # the heavy one still runs
            await heavy.close()
            await other.close()
            rig.views.close()  # the heavy evaluation ends at its timeout, in its thread

    asyncio.run(asyncio.wait_for(main(), WAIT))


class _SlowLoads(TidingsChain):
    """The real chain, whose loads of one table wait for the test to let them go: a load
    that takes as long as a large table's, on demand (no real server is that slow at will)."""

    def __init__(self, address: str, slow_table: str) -> None:
        super().__init__(address)
        self.slow_table = slow_table
        self.go = asyncio.Event()
        self.waiting = asyncio.Event()

    async def _load(self, client: Client, table: str, row_type: QueryType) -> None:
        if table == self.slow_table:
            self.waiting.set()
            await self.go.wait()
        await super()._load(client, table, row_type)


def test_a_table_loading_for_one_view_holds_no_other_subscribe_nor_the_events(
    tmp_path: Path,
) -> None:
    """A view on ``users`` waits for its table's load; meanwhile another subscriber
    subscribes to events and to a view on ``orders`` (a load of its own) and gets its
    events, and row changes of ``users`` made during the load are in the view once it is
    loaded."""

    async def main() -> None:
        async with running(tmp_path) as srv:
            chain = _SlowLoads(srv.address, "users")
            async with (
                chain_rig(srv.address, chain=chain) as rig,
                await connect(srv.address) as producer,
            ):
                await _users(producer, 3)
                heavy, other = await rig.client(), await rig.client()
                subscribing = asyncio.create_task(
                    heavy.subscribe_sql("u", "SELECT id, age FROM users ORDER BY id")
                )
                await asyncio.wait_for(chain.waiting.wait(), WAIT)
                await other.subscribe_events("e", [["app", "*"]])
                await other.subscribe_sql("o", "SELECT count(*) AS n FROM orders")
                changed: list[StoredEvent | None] = await producer.register_with_response(
                    [
                        json_event(("app", "x"), {"i": 2}),
                        json_event(("rows.users",), {"key": 1, "row": {"id": 1, "age": 99}}),
                    ]
                )
                assert all(changed)
                assert (await _event(other, "e"))["payload"] == {"i": 2}
                assert (await next_view(other, "o", WAIT))["rows"] == [[0]]
                assert not subscribing.done()  # the users load is still held
                chain.go.set()
                assert (await subscribing)["op"] == "subscribed"
                view = await next_view(heavy, "u", WAIT)
                assert view["rows"] == [[0, 30], [1, 99], [2, 30]]
                await heavy.close()
                await other.close()

    asyncio.run(asyncio.wait_for(main(), WAIT))


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.01)
