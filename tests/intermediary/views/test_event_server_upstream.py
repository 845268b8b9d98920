"""Event-type and SQL-view subscriptions through the tidings chain, without Spark: a real
event server on a real socket (events registered with the public client), the real chain,
an intermediary served over WebSocket and real subscriber clients. No test asserts timings:
waits are bounded only so that a broken build fails instead of hanging."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.intermediary.views.test_patterns import brute
from tests.support.certificates import TestCA, TlsSetup
from tests.support.chain_helpers import CATALOG, DDL, ChainRig, chain_rig, next_view, reference
from tests.support.intermediary_helpers import WHOLE, WORLD
from tests.support.server_helpers import Running, running
from tidings.client import Client, StoredEvent, connect, json_event
from tidings.config.tls import TlsClientConfig
from tidings.errors import IntermediaryError
from tidings.events.matching import matches
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.node.intermediary import Intermediary
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.serving.connection import Connection
from tidings.intermediary.serving.envelope import DROPPED_CLOSE_CODE
from tidings.intermediary.serving.transport import IntermediaryServer, TransportLimits
from tidings.intermediary.views.event_server_upstream import TidingsChain
from tidings.intermediary.views.eventviews import EventViews
from tidings.intermediary.views.sqltables import TableState
from tidings.intermediary.views.sqlviews import SqlLimits
from tidings.server.eventer.server import EventerServer

pytestmark = pytest.mark.sockets

WAIT = 60.0


def run(main: Any) -> None:
    asyncio.run(asyncio.wait_for(main, WAIT))


@asynccontextmanager
async def _subscriber(
    tmp_path: Path,
) -> AsyncIterator[tuple[Running, ChainRig, IntermediaryClient]]:
    """A tidings server over a store in ``tmp_path``, an intermediary chained to it, and a
    subscriber of that intermediary (closed at the end)."""
    async with running(tmp_path) as srv, chain_rig(srv.address) as rig:
        client = await rig.client()
        try:
            yield srv, rig, client
        finally:
            await client.close()


def _id(event: StoredEvent) -> tuple[int, int, int]:
    return (event.id.server, event.id.session, event.id.instance)


def test_event_subscribers_get_exactly_their_matching_events_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv, chain_rig(srv.address) as rig:
            a, b = await rig.client(), await rig.client()
            assert (await a.subscribe_events("a", [["app", "a", "*"]]))["covered"] is False
            assert (await b.subscribe_events("b", [["app", "?", "x"]]))["covered"] is False
            types = [("app", "a"), ("app", "a", "x"), ("app", "b", "x"), ("app", "b"),
                     ("other", "a", "x"), ("app", "a", "y", "z")]  # fmt: skip
            sent: list[StoredEvent] = []
            async with await connect(srv.address) as producer:
                for n in range(60):  # sessions of 1 to 3 events, mixed types
                    batch = [
                        json_event(types[(n + i) % len(types)], {"n": n, "i": i}, 1000 + n)
                        for i in range(n % 3 + 1)
                    ]
                    sent += [e for e in await producer.register_with_response(batch) if e]
                [end] = await producer.register_with_response([json_event(("app", "a", "x"), 0)])
            assert end is not None
            for client, key, pattern in ((a, "a", ("app", "a", "*")), (b, "b", ("app", "?", "x"))):
                expected = [e for e in sent if matches(e.type, pattern)] + [end]
                got = [await client.message(WAIT) for _ in expected]
                # Exactly these, in the server's order: a duplicate or an extra event would
                # come before the last one and break the equality.
                assert [tuple(m["id"]) for m in got] == [_id(e) for e in expected]
                assert {m["key"] for m in got} == {key}
                assert [tuple(m["type"]) for m in got] == [e.type for e in expected]
                assert [m["timestamp"] for m in got] == [e.timestamp_us for e in expected]
                assert [m["source_timestamp"] for m in got[:-1]] == [
                    e.source_timestamp_us for e in expected[:-1]
                ]
                assert [m["payload"] for m in got] == [json.loads(e.payload) for e in expected]
            await a.close()
            await b.close()

    run(main())


async def _sentinel(producer: Client, event_type: tuple[str, ...]) -> StoredEvent:
    [event] = await producer.register_with_response([json_event(event_type, "sentinel")])
    assert event is not None
    return event


async def _until_id(client: Any, event: StoredEvent) -> list[dict[str, Any]]:
    """The messages up to and including ``event``'s."""
    got = []
    while not got or tuple(got[-1]["id"]) != _id(event):
        got.append(await client.message(WAIT))
    return got


def test_covered_patterns_ask_nothing_upstream_and_unsubscribing_shrinks_the_set(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with (
            running(tmp_path) as srv,
            chain_rig(srv.address) as rig,
            await connect(srv.address) as producer,
        ):
            a, b = await rig.client(), await rig.client()
            assert (await a.subscribe_events("wide", [["app", "*"]]))["covered"] is False
            assert rig.views.patterns == (("app", "*"),)
            assert (await a.subscribe_events("narrow", [["app", "a", "?"]]))["covered"] is True
            # Covered by the union of two upstream patterns only: ("app", "a") alone is not.
            assert (await b.subscribe_events("pair", [["app", "a"], ["app", "a", "?", "*"]]))[
                "covered"
            ] is True
            assert len(rig.tap.updates) == 1  # the covered ones asked nothing upstream

            await a.unsubscribe("wide")
            assert rig.views.patterns == (("app", "a"), ("app", "a", "?", "*"))
            assert rig.tap.updates[-1][0] == rig.views.patterns
            # The server's subscription shrank: ("app", "zzz") is no longer delivered. Events
            # are notified in order, so once the later sentinel is through, it would be too.
            async with await connect(srv.address) as other:
                await other.register_with_response([json_event(("app", "zzz"), 1)])
            end = await _sentinel(producer, ("app", "a", "b"))
            assert [tuple(m["type"]) for m in await _until_id(a, end)] == [("app", "a", "b")]
            assert [tuple(m["type"]) for m in await _until_id(b, end)] == [("app", "a", "b")]
            assert ("app", "zzz") not in rig.tap.event_types()

            # Not covered again: the set grows, and the new subscriber gets its events.
            assert (await b.subscribe_events("q", [["app", "q"]]))["covered"] is False
            assert rig.views.patterns == (("app", "a"), ("app", "a", "?", "*"), ("app", "q"))
            end = await _sentinel(producer, ("app", "q"))
            assert [m["key"] for m in await _until_id(b, end)] == ["q"]

            await a.close()  # a disconnect unsubscribes everything of a
            await b.unsubscribe("pair")
            await b.unsubscribe("q")
            await asyncio.wait_for(_until(lambda: rig.views.patterns == ()), WAIT)
            assert rig.tap.updates[-1] == ((), {})
            await b.close()

    run(main())


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.01)


VIEW = (
    "SELECT u.name, u.city, count(o.id) AS n, sum(o.amount) AS total FROM users AS u "
    "LEFT JOIN orders AS o ON o.user_id = u.id WHERE u.age >= 30 GROUP BY u.id ORDER BY u.id"
)


class Service:
    """Writes rows as row events straight into the server, and the same rows into a SQLite
    reference; ``results[k]`` is the view on the reference after the first k changes."""

    def __init__(self, producer: Client, sql: str) -> None:
        self.producer = producer
        self.sql = sql
        self.db = sqlite3.connect(":memory:")
        for ddl in DDL:
            self.db.execute(ddl)
        self.results = [reference(self.db, sql)]
        self.rng = random.Random(7)

    async def change(self, table: str, key: int, row: dict[str, Any] | None) -> None:
        payload: dict[str, Any] = {"key": key, "row": row} if row else {"key": key, "deleted": True}
        [stored] = await self.producer.register_with_response(
            [json_event(("db", f"rows.{table}"), payload)]
        )
        assert stored is not None
        self.db.execute(f"DELETE FROM {table} WHERE id = ?", (key,))
        if row is not None:
            columns = ", ".join(row)
            marks = ", ".join("?" for _ in row)
            self.db.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", list(row.values()))
        self.results.append(reference(self.db, self.sql))

    async def round(self, changes: int) -> None:
        for _ in range(changes):
            r = self.rng.random()
            if r < 0.4:
                uid = self.rng.randrange(30)
                city = self.rng.choice(["Oslo", "Lima", "Pune"])
                row = {
                    "id": uid,
                    "name": f"u{uid}",
                    "city": city,
                    "age": self.rng.randrange(18, 60),
                }
                await self.change("users", uid, row)
            elif r < 0.85:
                oid = self.rng.randrange(80)
                row = {
                    "id": oid,
                    "user_id": self.rng.randrange(30),
                    "amount": self.rng.randrange(1, 500) / 4,
                }
                await self.change("orders", oid, row)
            else:
                table = self.rng.choice(["users", "orders"])
                await self.change(table, self.rng.randrange(30), None)


@asynccontextmanager
async def _with_service(
    tmp_path: Path, sql: str = "SELECT 1", *, users: int = 0, **options: Any
) -> AsyncIterator[tuple[ChainRig, Service]]:
    """A chain rig taking the row events ``db/...`` (``options`` go to :func:`chain_rig`),
    and a :class:`Service` writing to its event server (its reference view ``sql``) that
    has written ``users`` users."""
    async with (
        running(tmp_path) as srv,
        chain_rig(srv.address, row_type_prefix=("db",), **options) as rig,
        await connect(srv.address) as producer,
    ):
        service = Service(producer, sql)
        for uid in range(users):
            await service.change("users", uid, {"id": uid, "name": "n", "city": "c", "age": 1})
        yield rig, service


def test_a_sql_view_follows_the_row_events_and_never_shows_a_half_applied_epoch(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with _with_service(tmp_path, VIEW) as (rig, service):
            await service.round(40)  # before anyone subscribes: loaded with a query
            client = await rig.client()
            assert (await client.subscribe_sql("v", VIEW, rate_hz=500))["covered"] is False
            assert rig.views.tables == {"users", "orders"}
            first = await next_view(client, "v")
            assert first["columns"] == ["name", "city", "n", "total"]
            assert first["rows"] == service.results[-1]
            # A malformed row event is skipped (counted), the others are folded.
            await service.producer.register_with_response(
                [json_event(("db", "rows.users"), {"no": 1})]
            )
            for _ in range(4):
                await service.round(25)
                while (view := await next_view(client, "v"))["rows"] != service.results[-1]:
                    # Every view in between is the result after some prefix of the changes:
                    # an epoch is applied whole, in the server's order.
                    assert view["rows"] in service.results
            assert rig.views.bad_rows == 1

            other = await rig.client()
            assert (await other.subscribe_sql("o", "SELECT id, amount FROM orders ORDER BY id"))[
                "covered"
            ] is True
            assert (await next_view(other, "o"))["rows"] == reference(
                service.db, "SELECT id, amount FROM orders ORDER BY id"
            )
            await service.change("users", 1000, {"id": 1000, "name": "x", "city": "y", "age": 1})
            message = await other.message(WAIT)  # its table did not change: said explicitly
            assert message == {
                "op": "view",
                "key": "o",
                "epoch": message["epoch"],
                "unchanged": True,
            }
            await other.subscribe_sql("none", "SELECT id FROM users WHERE age > 1000")
            assert (await next_view(other, "none")) == {
                "op": "view", "key": "none", "epoch": rig.views.epoch, "columns": ["id"], "rows": []
            }  # fmt: skip

            await client.close()
            await other.unsubscribe("o")
            await asyncio.wait_for(_until(lambda: rig.views.tables == {"users"}), WAIT)
            assert rig.views.patterns == (("db", "rows.users"),)
            await other.close()

    run(main())


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"events": [["a", "*", "b"]]}, r"events\[0\]: .*'\*' is allowed only as the last"),
        ({"events": "a.*"}, "events: expected a non-empty list of patterns"),
        ({"events": [["a"]], "rate_hz": 5}, "takes no rate_hz or priority"),
        ({"sql": "DELETE FROM users"}, "SELECT"),
        ({"sql": "SELECT * FROM secrets"}, "secrets"),
        ({"sql": "SELECT password FROM users"}, "password"),
        ({"sql": "SELECT id FROM users", "capabilities": {}}, "only a region subscription"),
        (
            {"sql": "SELECT id FROM users", "region": {"box": {"lo": [0, 0], "hi": [1, 1]}}},
            "exactly one of region, events and sql, got region, sql",
        ),
        ({}, "exactly one of region, events and sql, got none"),
        ({"sql": "SELECT id FROM users", "rate_hz": -1}, "rate_hz"),
        ({"sql": "SELECT id FROM users", "priority": 1e300}, "priority: expected a number in"),
        ({"sql": "SELECT id FROM users WHERE", "priority": 1}, "sql|SQL|parse"),
    ],
)
def test_bad_requests_get_a_clear_error_and_the_connection_goes_on(
    tmp_path: Path, request_: dict[str, Any], message: str
) -> None:
    async def main() -> None:
        async with _subscriber(tmp_path) as (_, rig, client):
            with pytest.raises(IntermediaryError, match=message):
                await client.request({"op": "subscribe", "key": "k", **request_})
            assert rig.views.patterns == ()
            await client.subscribe_sql("k", "SELECT id FROM users")
            assert (await next_view(client, "k"))["rows"] == []

    run(main())


def test_the_active_tables_change_only_when_an_epoch_is_swapped_in() -> None:
    inert, active = TableState(CATALOG), TableState(CATALOG)
    inert.upsert("users", [{"id": 1, "name": "a"}], "id")
    assert active.table("users") is None
    assert active.adopt(inert) == {"users"}
    inert.upsert("users", [{"id": 2, "name": "b"}], "id")
    inert.delete("users", [1])
    assert active.table("users").to_pylist() == [
        {"id": 1, "name": "a"}
    ]  # the inert side's changes are not seen
    assert active.adopt(inert) == {"users"}
    assert active.table("users").column("id").to_pylist() == [2]
    assert active.adopt(inert) == frozenset()


def test_an_event_subscriber_that_never_reads_is_closed_with_a_reason_and_loses_nothing_before(
    tmp_path: Path,
) -> None:
    """Events are never dropped: a subscriber whose queue backs up past the limit is closed
    (4008 and the reason) while another, reading, gets every event."""

    async def main() -> None:
        limits = TransportLimits(send_buffer_bytes=4096, max_queued_messages=20)
        async with (
            running(tmp_path) as srv,
            chain_rig(srv.address, limits=limits) as rig,
            await connect(srv.address) as producer,
        ):
            good = await rig.client()
            await good.subscribe_events("all", [["app", "*"]])
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", rig.server.port))
            slow = await websockets.connect(rig.url, sock=sock, max_queue=1)
            hello = json.loads(await slow.recv())
            await slow.send(json.dumps({"op": "subscribe", "key": "s", "events": [["app", "*"]]}))
            assert json.loads(await slow.recv())["op"] == "subscribed"
            sent: list[StoredEvent] = []
            while not any(d.subscriber == hello["subscriber"] for d in rig.server.disconnects):
                batch = [json_event(("app", "x"), {"pad": "x" * 2000}) for _ in range(10)]
                sent += [e for e in await producer.register_with_response(batch) if e]
                got = [await good.message(WAIT) for _ in range(10)]
                assert [tuple(m["id"]) for m in got] == [_id(e) for e in sent[-10:]]
            record = next(d for d in rig.server.disconnects if d.subscriber == hello["subscriber"])
            assert record.code == DROPPED_CLOSE_CODE
            assert record.reason == "too slow: more than 20 messages waiting to be sent"
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    await slow.recv()
            assert slow.close_code == DROPPED_CLOSE_CODE
            await asyncio.wait_for(
                _until(lambda: not rig.views.subscriptions(hello["subscriber"])), WAIT
            )
            await good.close()

    run(main())


def test_a_view_subscribed_while_the_service_writes_loads_and_folds_each_change_once(
    tmp_path: Path,
) -> None:
    """The load races the notifications: changes registered before, during and after the
    load query. Every view is the result after some prefix of the changes (none folded twice
    or out of order), and the last equals the reference."""

    async def main() -> None:
        async with _with_service(tmp_path, VIEW) as (rig, service):
            await service.round(20)
            client = await rig.client()
            writing = asyncio.create_task(service.round(150))
            await asyncio.sleep(0)  # let the writer start first
            await client.subscribe_sql("v", VIEW, rate_hz=1000)
            seen = 0
            rows = None
            while not (writing.done() and rows == service.results[-1]):
                rows = (await next_view(client, "v"))["rows"]
                assert rows in service.results
                seen += 1
            assert seen > 1
            await writing
            await client.close()

    run(main())


def test_a_key_names_one_subscription_whatever_its_kind(tmp_path: Path) -> None:
    async def main() -> None:
        async with _subscriber(tmp_path) as (_, rig, client):
            spatial = rig.server.intermediary.publishers
            await client.subscribe("k", WHOLE)
            assert set(spatial.subscriptions(client.subscriber)) == {"k"}
            await client.subscribe_events("k", [["app", "*"]])
            assert not spatial.subscriptions(client.subscriber)
            assert rig.views.subscriptions(client.subscriber) == ["k"]
            await client.subscribe_sql("k", "SELECT id FROM users")
            assert rig.views.subscriptions(client.subscriber) == ["k"]
            assert rig.views.patterns == (("rows.users",),)  # the events' pattern is gone
            await client.subscribe("k", WHOLE)
            assert rig.views.subscriptions(client.subscriber) == []
            assert rig.views.patterns == ()
            assert (await client.unsubscribe("k"))["removed"] == 1

    run(main())


def test_while_the_event_server_is_away_subscribers_are_told_and_new_needs_wait_for_it(
    tmp_path: Path,
) -> None:
    """The server's Eventer closes and opens again on the same store and port: the
    subscriber is told the upstream is stale and then fresh, keeps its connection, may
    subscribe meanwhile (to what needs the server), and gets every event registered while
    the intermediary was away once, in order, for the old and the new subscription."""

    async def main() -> None:
        async with _subscriber(tmp_path) as (srv, rig, client):
            got: list[dict[str, Any]] = []
            await client.subscribe_events("a", [["app", "*"]])
            async with await connect(srv.address) as producer:
                await producer.register_with_response([json_event(("app", "1"), 1)])
            await srv.server.aclose()
            stale = await _read_until(client, got, lambda m: m["op"] == "status")
            assert stale["upstream"] == "event_server" and stale["stale"] is True
            assert stale["reason"]
            assert (await client.subscribe_events("b", [["other"]]))["covered"] is False
            server = await EventerServer.start(srv.address, srv.engine)
            try:
                async with await connect(srv.address) as producer:
                    await producer.register_with_response(
                        [json_event(("app", "2"), 2), json_event(("other",), 3)]
                    )
                fresh = await _read_until(client, got, lambda m: m["op"] == "status")
                assert fresh == {"op": "status", "upstream": "event_server", "stale": False}
                async with await connect(srv.address) as producer:
                    await producer.register_with_response([json_event(("app", "3"), 4)])
                await _read_until(client, got, lambda m: m.get("payload") == 4)
            finally:
                await server.aclose()
            events = [(m["key"], m["payload"]) for m in got if m["op"] == "event"]
            assert events == [("a", 1), ("a", 2), ("b", 3), ("a", 4)]
            assert rig.tap.chain.resyncs == 1 and rig.tap.chain.stale is None

    run(main())


def test_a_loss_ridden_out_between_two_ticks_is_still_told_stale_then_fresh(
    tmp_path: Path,
) -> None:
    """The server's Eventer closes and opens again, and the chain is back before the
    intermediary's next tick: the ticks are stepped by hand here, so that the whole outage
    falls between two (a redundant peer answering at once does that on its own, and once
    did it unseen, so subscribers were told neither the loss nor the return). They are told
    both: the loss before what the tick brings (the event registered after it), the return
    after (it follows whatever caught up in the same tick)."""

    async def step_until(client: IntermediaryClient, server: IntermediaryServer) -> Any:
        for _ in range(int(WAIT / 0.01)):
            server.step()
            with contextlib.suppress(TimeoutError):
                return await client.message(0.01)
        raise AssertionError("no message")

    async def main() -> list[dict[str, Any]]:
        async with running(tmp_path) as srv:
            chain = TidingsChain(srv.address)
            await chain.start()
            node = Intermediary(2, Simulation(0, WORLD).feed(), world=WORLD)
            server = IntermediaryServer(
                node,
                views=EventViews(chain, CATALOG),
                tick_s=None,
                upstreams=lambda: {"event_server": chain.staleness},
            )
            await server.start()
            client = await IntermediaryClient.connect(f"ws://127.0.0.1:{server.port}/")
            try:
                await client.subscribe_events("a", [["app", "*"]])
                async with await connect(srv.address) as producer:
                    await producer.register_with_response([json_event(("app", "1"), 1)])
                got = [await step_until(client, server)]
                await srv.server.aclose()
                await _until(lambda: chain.stale is not None)
                eventer = await EventerServer.start(srv.address, srv.engine)
                try:
                    await _until(lambda: chain.resyncs == 1 and chain.stale is None)
                    async with await connect(srv.address) as producer:
                        await producer.register_with_response([json_event(("app", "2"), 2)])
                    while got[-1].get("stale") is not False:
                        got.append(await step_until(client, server))
                finally:
                    await eventer.aclose()
            finally:
                await client.close()
                await server.aclose()
                await chain.aclose()
        return got

    got = asyncio.run(asyncio.wait_for(main(), 2 * WAIT))
    assert [(m["op"], m.get("payload", m.get("stale"))) for m in got] == [
        ("event", 1),
        ("status", True),
        ("event", 2),
        ("status", False),
    ]


async def _until(condition: Callable[[], bool]) -> None:
    """Wait (the event loop running on) until ``condition`` holds."""
    while not condition():
        await asyncio.sleep(0.005)


async def _read_until(
    client: IntermediaryClient, got: list[dict[str, Any]], last: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Read messages into ``got`` up to the first for which ``last`` holds; that one."""
    while True:
        message = await client.message(WAIT)
        got.append(message)
        if last(message):
            return message


def test_a_view_stopped_by_its_bounds_says_so_and_the_subscription_goes_on(
    tmp_path: Path,
) -> None:
    heavy = "SELECT count(*) AS n FROM users AS a JOIN users AS b JOIN users AS c"

    async def main() -> None:
        limits = SqlLimits(max_steps=20_000)
        async with _with_service(tmp_path, users=40, sql_limits=limits) as (rig, _):
            client = await rig.client()
            await client.subscribe_sql("h", heavy)
            await client.subscribe_sql("ok", "SELECT count(*) AS n FROM users")
            got: dict[str, dict[str, Any]] = {}
            while len(got) < 2:
                message = await client.message(WAIT)
                got[message["key"]] = message
            assert got["h"]["error"] == "the view was stopped: it took more than 20000 steps"
            assert got["ok"]["rows"] == [[40]]
            await client.close()

    run(main())


HEAVY = "SELECT count(*) AS n FROM users AS a, users AS b, users AS c, users AS d, users AS e"


def _with_users(
    tmp_path: Path, timeout_s: float
) -> AbstractAsyncContextManager[tuple[ChainRig, Service]]:
    """A chain rig whose views stop after ``timeout_s``, and 60 users written."""
    limits = SqlLimits(timeout_s=timeout_s, max_steps=10**12)
    return _with_service(tmp_path, users=60, sql_limits=limits)


def test_a_view_running_to_its_bound_does_not_stall_the_other_subscribers(
    tmp_path: Path,
) -> None:
    """A hostile cartesian view runs until its time bound (3 s); meanwhile another
    subscriber's requests are answered (20 round trips take far less than the bound)."""

    async def main() -> None:
        async with _with_users(tmp_path, 3.0) as (rig, _):
            hostile, honest = await rig.client(), await rig.client()
            await honest.subscribe_sql("n", "SELECT count(*) AS n FROM users")
            assert (await next_view(honest, "n"))["rows"] == [[60]]  # all rows are held
            await hostile.subscribe_sql("h", HEAVY)
            stopped = asyncio.create_task(hostile.message(WAIT))
            for _ in range(20):
                assert (await honest.unsubscribe("nothing"))["removed"] == 0
            assert not stopped.done()
            assert (await stopped)["error"] == "the view was stopped: it took more than 3.0 s"
            await hostile.close()
            await honest.close()

    run(main())


def test_a_view_due_while_its_subscriber_is_evaluated_gets_the_newest_epoch(
    tmp_path: Path,
) -> None:
    """Two epochs arrive while the subscriber's heavy view runs: its light view is due in
    both; the second must not be lost (nothing changes after it to make it due again)."""

    async def main() -> None:
        async with _with_users(tmp_path, 1.0) as (rig, service):
            client = await rig.client()
            await client.subscribe_sql("n", "SELECT count(*) AS n FROM users")
            assert (await next_view(client, "n"))["rows"] == [[60]]
            await client.subscribe_sql("h", HEAVY)
            while "error" not in (message := await client.message(WAIT)) or message["key"] != "h":
                pass
            for uid in (60, 61):  # two epochs, while the heavy view runs again
                epoch = rig.views.epoch
                await service.change("users", uid, {"id": uid, "name": "n", "city": "c", "age": 1})
                while rig.views.epoch == epoch:
                    await asyncio.sleep(0.001)
            while (await next_view(client, "n"))["rows"] != [[62]]:
                pass
            await client.close()

    run(main())


def test_a_subscriber_of_heavy_views_delays_another_view_by_one_evaluation_at_most(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with _with_users(tmp_path, 1.0) as (rig, _):
            hostile, honest = await rig.client(), await rig.client()
            for key in ("h1", "h2", "h3"):
                await hostile.subscribe_sql(key, HEAVY)
            await honest.subscribe_sql("n", "SELECT count(*) AS n FROM users")
            stopped: list[str] = []

            async def read() -> None:
                while True:
                    stopped.append((await hostile.message(WAIT))["key"])

            reader = asyncio.create_task(read())
            assert (await next_view(honest, "n"))["rows"] == [[60]]
            assert len(stopped) <= 1, stopped  # not after all three heavy views
            while len(stopped) < 3:  # the others are served in turn, none skipped
                await asyncio.sleep(0.01)
            assert sorted(stopped) == ["h1", "h2", "h3"]
            reader.cancel()
            await hostile.close()
            await honest.close()

    run(main())


def test_a_view_reading_no_column_of_an_empty_table_counts_zero(tmp_path: Path) -> None:
    async def main() -> None:
        async with _subscriber(tmp_path) as (_, _, client):
            await client.subscribe_sql("n", "SELECT count(*) AS n FROM orders")
            assert (await next_view(client, "n"))["rows"] == [[0]]

    run(main())


def test_random_subscribes_and_unsubscribes_keep_upstream_exactly_the_union(
    tmp_path: Path,
) -> None:
    """Through the real chain: after every request the upstream set covers every live
    subscription and holds nothing none of them needs (brute force over a small alphabet),
    ``covered`` is what brute force says of the set before, and the event server was sent
    the set the intermediary reports."""
    rng = random.Random(5)

    def pattern() -> tuple[str, ...]:
        body = tuple(rng.choice(["a", "b", "?"]) for _ in range(rng.randrange(4)))
        return (*body, "*") if rng.random() < 0.4 or not body else body

    async def main() -> None:
        async with running(tmp_path) as srv, chain_rig(srv.address) as rig:
            live: dict[tuple[int, str], list[tuple[str, ...]]] = {}
            for _ in range(150):
                sid = (rng.randrange(3), rng.choice("xyz"))
                if live and rng.random() < 0.35:
                    sid = rng.choice(sorted(live))
                    assert await rig.views.unsubscribe(*sid) == 1
                    del live[sid]
                else:
                    patterns = [pattern() for _ in range(rng.randrange(1, 3))]
                    before = list(rig.views.patterns)
                    was = await rig.views.subscribe(*sid, events=[list(p) for p in patterns])
                    assert was == all(brute(before, p) for p in patterns)
                    live[sid] = patterns
                wanted = [p for ps in live.values() for p in ps]
                upstream = list(rig.views.patterns)
                assert all(brute(upstream, p) for p in wanted)
                assert all(brute(wanted, p) for p in upstream)
                assert not rig.tap.updates or rig.tap.updates[-1][0] == rig.views.patterns

    run(main())


def test_a_subscriber_holds_at_most_its_share_of_event_and_view_subscriptions(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv, chain_rig(srv.address) as rig:
            client = await rig.client()
            limit = rig.views.max_per_subscriber
            for n in range(limit):
                await client.subscribe_events(f"k{n}", [["app", str(n)]])
            with pytest.raises(IntermediaryError, match=f"at most {limit} event and SQL"):
                await client.subscribe_sql("one-more", "SELECT id FROM users")
            await client.subscribe_events("k0", [["app", "again"]])  # replacing is fine
            await client.unsubscribe("k1")
            await client.subscribe_sql("one-more", "SELECT id FROM users")
            assert len(rig.views.subscriptions(client.subscriber)) == limit
            await client.close()
            await asyncio.wait_for(_until(lambda: rig.views.patterns == ()), WAIT)

    run(main())


def test_a_view_subscriber_that_never_reads_holds_one_pending_view_not_a_backlog(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        limits = TransportLimits(send_buffer_bytes=4096)
        sql = "SELECT id, name FROM users ORDER BY id"
        async with _with_service(tmp_path, sql, limits=limits) as (rig, service):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", rig.server.port))
            slow = await websockets.connect(rig.url, sock=sock, max_queue=1, close_timeout=0.5)
            hello = json.loads(await slow.recv())
            await slow.send(json.dumps({"op": "subscribe", "key": "v", "sql": sql}))
            assert json.loads(await slow.recv())["op"] == "subscribed"
            conn = rig.server.connections[hello["subscriber"]]
            n = 0
            while conn.replaced < 5:  # it never reads: views pile up unless replaced
                name = f"{n}" + "x" * 20_000  # a few rows, each view ~100 kB
                await service.change("users", n % 5, {"id": n % 5, "name": name})
                n += 1
                assert len(conn.views) <= 1 and conn.cursor == rig.server.ring.end
            assert hello["subscriber"] in rig.server.connections  # not closed for it
            await slow.close()

    run(main())


def test_an_unchanged_view_never_replaces_the_pending_one_it_refers_to() -> None:
    """Unit level, on the server's queueing alone (no socket needed to decide it)."""
    rig = IntermediaryServer(Intermediary(2, Simulation(0, WORLD).feed(), world=WORLD))
    conn = Connection(1, None)  # type: ignore[arg-type]
    rig.connections[1] = conn
    rows = {"op": "view", "key": "v", "epoch": 1, "columns": ["a"], "rows": [[1]]}
    same = {"op": "view", "key": "v", "epoch": 2, "unchanged": True}
    newer = {"op": "view", "key": "v", "epoch": 3, "columns": ["a"], "rows": [[2]]}
    rig._queue([(1, rows), (1, same)])
    assert json.loads(conn.views["v"]) == rows
    rig._queue([(1, newer)])
    assert json.loads(conn.views["v"]) == newer and conn.replaced == 1


def test_the_chain_follows_a_server_over_mutual_tls_and_refuses_one_it_cannot_verify(
    tmp_path: Path,
) -> None:
    setup = TlsSetup(tmp_path / "pki")
    stranger = TestCA(tmp_path / "other", "other")

    async def main() -> None:
        async with running(tmp_path, tls=setup.server_tls(mutual=True)) as srv:
            chain = TidingsChain(srv.address, tls=setup.client_tls("intermediary"))
            await chain.start()
            try:
                await chain.update([("app", "*")], {})
                async with await connect(srv.address, tls=setup.client_tls("app")) as producer:
                    [sent] = await producer.register_with_response([json_event(("app", "x"), 1)])
                got: list[StoredEvent] = []
                while not got:
                    got += [e for batch in chain.take() for e in batch.events]
                    await asyncio.sleep(0.01)
                assert got == [sent]
            finally:
                await chain.aclose()
            untrusting = TidingsChain(srv.address, tls=TlsClientConfig(ca_file=str(stranger.cert)))
            with pytest.raises(IntermediaryError, match="certificate is refused"):
                await untrusting.start()

    run(main())
