"""The Eventer server with tidings' own client, over real sockets, on a real SQLite store."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.support.server_helpers import (
    async_engine,
    raw_frame,
    raw_message,
    read_raw_frame,
    running,
    wait_peer_closed,
    warnings_of,
)
from tests.support.waiting import run, until
from tidings.client import connect, json_event, json_value
from tidings.errors import ClientError, ConfigError, ConnectionClosed
from tidings.events.model import NewEvent, PayloadKind, StoredEvent
from tidings.events.query import QueryData
from tidings.server.engine import Engine, SessionEvent
from tidings.server.eventer.server import EVENTER_EVENT_TYPE, EventerServer
from tidings.server.store import EventStore
from tidings.wire import chatter_client, codec

pytestmark = pytest.mark.sockets


def types_of(events: list[StoredEvent | None]) -> list[tuple[str, ...] | None]:
    return [None if e is None else e.type for e in events]


async def eventer_statuses(store: EventStore) -> list[str]:
    events = await asyncio.to_thread(
        lambda: [e for e in store.read(0, 10_000) if e.type == EVENTER_EVENT_TYPE]
    )
    return [json_value(e) for e in events]


# --- register -------------------------------------------------------------------------------


def test_register_with_response_shares_session_and_timestamp(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv, await connect(srv.address) as client:
            first = await client.register_with_response(
                [
                    json_event(("a", "1"), {"x": 1}, source_timestamp_us=-5),
                    NewEvent(("a", "2"), b"\x00raw", PayloadKind.BINARY),
                    NewEvent(("a", "3")),
                ]
            )
            second = await client.register_with_response([json_event(("b",), None)])
            assert all(e is not None for e in first + second)
            a1, a2, a3 = first
            [b] = second
            assert a1 and a2 and a3 and b
            assert len({e.id.session for e in first}) == 1
            assert len({e.timestamp_us for e in first}) == 1
            assert [e.id.instance for e in first] == [
                a1.id.instance,
                a1.id.instance + 1,
                a1.id.instance + 2,
            ]
            assert b.id.session == a1.id.session + 1
            assert b.id.instance == a3.id.instance + 1  # one counter across sessions (0.8.5)
            assert b.timestamp_us >= a1.timestamp_us
            assert (a1.payload, a1.payload_kind, a1.source_timestamp_us) == (
                b'{"x": 1}',
                PayloadKind.JSON,
                -5,
            )
            assert (a2.payload, a2.payload_kind) == (b"\x00raw", PayloadKind.BINARY)
            assert (a3.payload, a3.payload_kind, a3.source_timestamp_us) == (None, None, None)
            assert json_value(b) is None
            assert all(e.id.server == 1 for e in first + second)

    run(main())


def test_fire_and_forget_register_is_handled_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv, await connect(srv.address) as client:
            for index in range(20):
                await client.register([json_event(("ff", str(index)), index)])
            found = await client.query(QueryData(event_types=(("ff", "*"),), order="ascending"))
            assert [json_value(e) for e in found] == list(range(20))
            assert len({e.id.session for e in found}) == 20

    run(main())


def test_invalid_type_fails_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv, await connect(srv.address) as client:
            results = await client.register_with_response(
                [
                    NewEvent(("ok", "1")),
                    NewEvent(("bad", "?")),
                    NewEvent(("bad", "*", "x")),
                    NewEvent(("ok", "2")),
                ]
            )
            assert types_of(results) == [("ok", "1"), None, None, ("ok", "2")]
            ok1, _, _, ok2 = results
            assert ok1 and ok2 and ok1.id.session == ok2.id.session
            assert await client.register_with_response([NewEvent(("?",))]) == [None]
            assert await client.register_with_response([]) == []
            found = await client.query(QueryData(event_types=(("ok", "*"),)))
            assert len(found) == 2

    run(main())
    assert sum("reserved as a query wildcard" in line for line in warnings_of(caplog)) == 3


def test_the_servers_consumer_events_are_refused_from_clients(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client could otherwise forge a stream consumer's position (its origin: this
    server) and move it past events it never read."""
    forged = json_event(
        ("tidings", "stream", "consumer", "s", "u", "C", "1"),
        {"stream": "s", "user": "u", "component": "C", "covers": [[1, 1, 99]]},
    )

    async def main() -> None:
        async with running(tmp_path) as srv, await connect(srv.address) as client:
            results = await client.register_with_response([forged, NewEvent(("ok",))])
            assert types_of(results) == [None, ("ok",)]
            found = await client.query(QueryData(event_types=(("tidings", "stream", "*"),)))
            assert found == []

    run(main())
    assert any("reserved prefix tidings/stream/consumer" in line for line in warnings_of(caplog))


class Exploding:
    """A module that aborts every session containing a ``boom`` event."""

    name = "exploding"
    subscription = (("boom",),)

    def on_session_start(self, session_id: int) -> None:
        pass

    def process(self, session_id: int, event: SessionEvent) -> list[NewEvent]:
        raise RuntimeError("boom")

    def on_session_stop(self, session_id: int) -> None:
        pass


def test_session_aborted_by_a_module_fails_every_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with running(tmp_path, [Exploding()]) as srv, await connect(srv.address) as client:
            results = await client.register_with_response([NewEvent(("ok",)), NewEvent(("boom",))])
            assert results == [None, None]
            [ok] = await client.register_with_response([NewEvent(("ok",))])
            assert ok is not None
            assert [e.type for e in await client.query(QueryData(event_types=(("ok",),)))] == [
                ("ok",)
            ]

    run(main())
    assert any("module exploding failed" in line for line in warnings_of(caplog))


def test_register_from_many_clients_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv:
            clients = [await connect(srv.address) for _ in range(5)]
            try:
                batches = await asyncio.gather(
                    *(
                        c.register_with_response(
                            [NewEvent(("c", str(i), str(j))) for j in range(3)]
                        )
                        for i, c in enumerate(clients)
                        for _ in range(4)
                    )
                )
            finally:
                for c in clients:
                    await c.aclose()
            sessions = [{e.id.session for e in batch if e} for batch in batches]
            assert all(len(s) == 1 for s in sessions)
            assert len({s.pop() for s in sessions}) == 20

    run(main())


# --- queries --------------------------------------------------------------------------------


def test_queries(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv, await connect(srv.address) as client:
            stored = []
            for index, event_type in enumerate(
                [("q", "a"), ("q", "b"), ("q", "a"), ("q", "x", "y"), ("r",)]
            ):
                [event] = await client.register_with_response(
                    [json_event(event_type, index, source_timestamp_us=100 - index)]
                )
                assert event is not None
                stored.append(event)

            def values(events: list[StoredEvent]) -> list[Any]:
                return [json_value(e) for e in events]

            q_all = QueryData(event_types=(("q", "*"),))
            assert values(await client.query(q_all)) == [3, 2, 1, 0]
            assert values(await client.query(QueryData(event_types=(("q", "?"),)))) == [2, 1, 0]
            ascending = QueryData(event_types=(("q", "*"),), order="ascending", max_results=2)
            assert values(await client.query(ascending)) == [0, 1]
            unique = QueryData(event_types=(("q", "?"),), unique_type=True)
            assert values(await client.query(unique)) == [2, 1]
            by_source = QueryData(event_types=(("q", "*"),), order_by="source_timestamp")
            assert values(await client.query(by_source)) == [0, 1, 2, 3]
            window = QueryData(t_from=stored[1].timestamp_us, t_to=stored[2].timestamp_us)
            assert values(await client.query(window)) == [2, 1]
            ids = QueryData(event_ids=(stored[4].id, stored[0].id))
            assert values(await client.query(ids)) == [4, 0]
            payload = QueryData(payload=(PayloadKind.JSON, b"3"))
            assert values(await client.query(payload)) == [3]
            assert await client.query(QueryData(server_id=2)) == []
            everything = await client.query()
            assert everything[-1].type == EVENTER_EVENT_TYPE
            assert everything[0] == stored[4]

    run(main())


def test_invalid_query_gets_an_empty_reply(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv:
            connection = await chatter_client.connect(srv.address, ping_interval=None)
            value = codec.query_to_sbs(QueryData())
            value["types"] = ("value", [["*", "x"]])
            reply = await connection.request("HatEventer", "MsgQueryReq", value, timeout=5)
            assert (reply.type, reply.data) == ("MsgQueryRes", [])
            value["types"] = ("value", [["*"]])
            reply = await connection.request("HatEventer", "MsgQueryReq", value, timeout=5)
            assert [tuple(e["type"]) for e in reply.data] == [EVENTER_EVENT_TYPE]
            await connection.aclose()

    run(main())
    [line] = warnings_of(caplog)
    assert "query from" in line and "'*' is allowed only as the last segment" in line


# --- subscriptions --------------------------------------------------------------------------


def test_subscribe_notify_and_replace(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            running(tmp_path) as srv,
            await connect(srv.address, [("a", "*")]) as subscriber,
            await connect(srv.address, [("a", "*")]) as twin,
            await connect(srv.address) as producer,
        ):
            await subscriber.query(QueryData(max_results=0))  # the subscription is in place
            await twin.query(QueryData(max_results=0))
            registered = await producer.register_with_response(
                [NewEvent(("a", "1")), NewEvent(("b", "1")), NewEvent(("a", "x", "2"))]
            )
            notified = await subscriber.receive()
            assert notified == [registered[0], registered[2]]
            assert await twin.receive() == notified

            await subscriber.subscribe([("b", "?"), ("event", "eventer")])
            await subscriber.query(QueryData(max_results=0))
            await producer.register_with_response([NewEvent(("a", "3"))])
            [b2] = await producer.register_with_response([NewEvent(("b", "2"))])
            assert await subscriber.receive() == [b2]
            assert types_of(await twin.receive()) == [("a", "3")]

            await subscriber.subscribe([])
            await subscriber.query(QueryData(max_results=0))
            await producer.register_with_response([NewEvent(("b", "3"))])
            await twin.subscribe([("b", "*")])
            await twin.query(QueryData(max_results=0))
            [b4] = await producer.register_with_response([NewEvent(("b", "4"))])
            assert await twin.receive() == [b4]
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(subscriber.receive(), 0.2)

    run(main())


def test_clients_read_notifications_and_replies_of_many_payload_less_events(
    tmp_path: Path,
) -> None:
    """8,000 events without payloads, registered at once: the notification and the query's
    reply are 13 values in 21 bytes an event, more values than a budget per byte allows, and
    the subscriber and the querying client read them whole (they were closed as protocol
    errors, while a hat client read the same reply)."""

    async def main() -> None:
        async with (
            running(tmp_path) as srv,
            await connect(srv.address, [("tiny", "*")]) as subscriber,
            await connect(srv.address) as producer,
        ):
            await subscriber.query(QueryData(max_results=0))  # the subscription is in place
            registered = await producer.register_with_response([NewEvent(("tiny", "x"))] * 8_000)
            assert None not in registered
            notified: list[StoredEvent] = []
            while len(notified) < len(registered):
                notified += await asyncio.wait_for(subscriber.receive(), 10)
            assert notified == registered
            reply = await producer.query(QueryData(event_types=(("tiny", "*"),)))
            assert sorted(reply, key=lambda e: e.id) == registered

    run(main())


def test_eventer_events_on_connect_and_disconnect(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            running(tmp_path) as srv,
            await connect(srv.address, [("event", "eventer")]) as watcher,
        ):
            await watcher.query(QueryData(max_results=0))
            other = await connect(srv.address)
            [connected] = await watcher.receive()
            assert json_value(connected) == "CONNECTED"
            [first] = await other.register_with_response([NewEvent(("x",))])
            assert first and first.id.session == connected.id.session + 1
            await other.aclose()
            [disconnected] = await watcher.receive()
            assert json_value(disconnected) == "DISCONNECTED"
            assert disconnected.source_timestamp_us is None
            assert disconnected.payload_kind is PayloadKind.JSON
            await until(lambda: srv.server.client_count == 1)
            await srv.server.aclose()  # disconnects the watcher too
            assert await eventer_statuses(srv.store) == [
                "CONNECTED",
                "CONNECTED",
                "DISCONNECTED",
                "DISCONNECTED",
            ]

    run(main())


def test_aclose_disconnects_clients_and_then_registers_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv:
            clients = [await connect(srv.address) for _ in range(3)]
            await until(lambda: srv.server.client_count == 3)
            await srv.server.aclose()
            for client in clients:
                with pytest.raises(ConnectionClosed):
                    await client.register_with_response([NewEvent(("late",))])
                await client.aclose()
            statuses = await eventer_statuses(srv.store)
            assert statuses.count("CONNECTED") == statuses.count("DISCONNECTED") == 3
            count = await asyncio.to_thread(srv.store.count)
            with pytest.raises(OSError):
                await connect(srv.address, timeout=2)
            await asyncio.sleep(0.05)
            assert await asyncio.to_thread(srv.store.count) == count

    run(main())


# --- outbox extension -----------------------------------------------------------------------


def test_register_outbox_stores_each_outbox_event_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            running(tmp_path) as srv,
            await connect(srv.address, [("o", "*")]) as subscriber,
            await connect(srv.address) as client,
        ):
            await subscriber.query(QueryData(max_results=0))
            first = await client.register_outbox(
                [json_event(("o", "a"), 1, outbox_event_id="id-1")]
            )
            again = await client.register_outbox(
                [
                    json_event(("o", "a"), 1, outbox_event_id="id-1"),
                    json_event(("o", "a"), 2, outbox_event_id="id-2"),
                    json_event(("o", "b"), 1, outbox_event_id="id-1"),  # another type
                ]
            )
            assert first[0] is not None and again[0] == first[0]
            assert first[0].outbox_event_id == "id-1"
            assert [e.outbox_event_id for e in again if e] == ["id-1", "id-2", "id-1"]
            assert again[1] and again[2] and again[1].id.session == again[2].id.session
            stored = await asyncio.to_thread(srv.store.by_outbox_ids, ["id-1", "id-2"])
            assert [e.type for e in stored["id-1"]] == [("o", "a"), ("o", "b")]
            assert len(stored["id-2"]) == 1
            # Subscribers hear of each stored event once: the duplicate is not re-announced.
            assert types_of(await subscriber.receive()) == [("o", "a")]
            assert types_of(await subscriber.receive()) == [("o", "a"), ("o", "b")]
            assert await client.register_outbox([]) == []

            with pytest.raises(ClientError, match="event 1 has no outbox_event_id"):
                await client.register_outbox(
                    [json_event(("o",), 1, outbox_event_id="x"), NewEvent(("o",))]
                )
            [bad] = await client.register_outbox([NewEvent(("o", "?"), outbox_event_id="x")])
            assert bad is None

    run(main())


# --- slow subscribers -----------------------------------------------------------------------


def test_slow_subscriber_is_dropped_and_nobody_waits_for_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A subscriber that never reads is dropped once 1 MiB is unsent; registration and a
    reading subscriber carry on throughout."""
    payload = b"p" * 256 * 1024
    sessions = 60  # 15 MiB: more than the limit plus both kernels' socket buffers

    async def main() -> None:
        async with running(tmp_path, max_subscriber_lag_bytes=1024 * 1024) as srv:
            slow = socket.socket()
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            slow.connect(("127.0.0.1", srv.server.port))
            slow.sendall(raw_message("HatEventer", "MsgSubscribe", [["big", "*"]]))
            async with (
                await connect(srv.address, [("big", "*")]) as reader,
                await connect(srv.address) as producer,
            ):
                await until(lambda: srv.server.client_count == 3)
                await reader.query(QueryData(max_results=0))
                received: list[StoredEvent] = []

                async def read_all() -> None:
                    while len(received) < sessions:
                        received.extend(await reader.receive())

                reading = asyncio.create_task(read_all())
                for index in range(sessions):
                    [event] = await producer.register_with_response(
                        [NewEvent(("big", str(index)), payload, PayloadKind.BINARY)]
                    )
                    assert event is not None
                await asyncio.wait_for(reading, 30)
                assert [e.type for e in received] == [("big", str(i)) for i in range(sessions)]
                await until(lambda: srv.server.client_count == 2)
                slow.setblocking(False)
                reader_side, _ = await asyncio.open_connection(sock=slow)
                await wait_peer_closed(reader_side)

    run(main(), timeout=60)
    [line] = warnings_of(caplog)
    assert "slow subscriber" in line and "max_subscriber_lag_bytes=1048576" in line


# --- bad input on a live socket -------------------------------------------------------------

BAD_INPUT = {
    "garbage": (b"GET / HTTP/1.1\r\n\r\n", "length of length 71"),
    "truncated frame": (b"\x01\x64" + b"x" * 10, "truncated frame (10 of 100 bytes)"),
    "oversize frame": (b"\x02\x10\x00" + b"x" * 100, "frame of 4096 bytes exceeds the limit"),
    "unknown message type": (raw_frame("HatEventer", "MsgHello", b""), "unknown message type"),
    "undecodable body": (
        raw_frame("HatEventer", "MsgQueryReq", b"\x81\x85"),
        "HatEventer.MsgQueryReq: undecodable SBS",
    ),
    "notify from a client": (
        raw_message("HatEventer", "MsgNotify", []),
        "unexpected message HatEventer.MsgNotify from an eventer client",
    ),
    "syncer message": (
        raw_message("HatSyncer", "MsgSynced", None),
        "unexpected message HatSyncer.MsgSynced",
    ),
    "invalid subscription": (
        raw_message("HatEventer", "MsgSubscribe", [["a"], ["*", "b"]]),
        "invalid subscription",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_closes_only_that_connection(
    case: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data, reason = BAD_INPUT[case]

    async def main() -> None:
        async with (
            running(tmp_path, max_frame_bytes=1024) as srv,
            await connect(srv.address, [("after", "*")]) as bystander,
        ):
            await bystander.query(QueryData(max_results=0))
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.server.port)
            writer.write(data)
            if case == "truncated frame":
                writer.write_eof()
            await wait_peer_closed(reader)
            writer.close()
            await until(lambda: srv.server.client_count == 1)

            async with await connect(srv.address) as second:
                [event] = await second.register_with_response([NewEvent(("after", case))])
                assert event is not None
                assert await second.query(QueryData(event_types=(("after", "*"),))) == [event]
            assert await bystander.receive() == [event]

    run(main())
    [line] = warnings_of(caplog)
    assert reason in line


def test_unanswered_pings_drop_the_client(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with running(tmp_path, ping_interval=0.1) as srv:
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.server.port)
            async with await connect(srv.address, ping_interval=None) as answering:
                await wait_peer_closed(reader)
                writer.close()
                # Our client answers pings, so it outlives several ping periods.
                await asyncio.sleep(0.3)
                assert await answering.register_with_response([NewEvent(("alive",))]) != [None]

    run(main())
    [line] = warnings_of(caplog)
    assert "no ping reply within 0.1 s" in line


def test_start_refuses_bad_limits(tmp_path: Path) -> None:
    async def main() -> None:
        async with async_engine(tmp_path / "events.db") as engine:
            for options in ({"max_frame_bytes": 0}, {"max_subscriber_lag_bytes": True}):
                with pytest.raises(ConfigError, match="must be a positive int"):
                    await EventerServer.start("tcp+sbs://127.0.0.1:0", engine, **options)

    run(main())


def test_register_replies_come_in_request_order_even_for_empty_requests(tmp_path: Path) -> None:
    """An empty register (nothing to store) is answered after the one sent before it."""

    async def main() -> list[tuple[int, int]]:
        async with running(tmp_path) as srv:
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.server.port)
            event = codec.register_event_to_sbs(NewEvent(("a",)))
            writer.write(
                raw_message("HatEventer", "MsgRegisterReq", [event], message_id=1, last=False)
                + raw_message("HatEventer", "MsgRegisterReq", [], message_id=2, last=False)
            )
            replies = []
            while len(replies) < 2:
                envelope, body = await read_raw_frame(reader)
                if envelope["data"]["type"] == "MsgRegisterRes":
                    replies.append((envelope["first"], len(body)))
            writer.close()
            return replies

    assert run(main()) == [(1, 1), (2, 0)]


def test_register_replies_follow_request_order_across_thread_and_inline_writes(
    tmp_path: Path,
) -> None:
    """Pipelined registers, large ones (written in the engine's thread) between small ones
    (written on the loop, answered at once when nothing is queued) and empty ones: every
    reply comes in request order, with the request's events."""
    sizes = [300, 1, 0, 1, 300, 0, 1, 1, 300, 1, 0, 1] * 3

    async def main() -> list[tuple[int, int]]:
        async with running(tmp_path) as srv:
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.server.port)
            frames = b"".join(
                raw_message(
                    "HatEventer",
                    "MsgRegisterReq",
                    [codec.register_event_to_sbs(NewEvent(("o", str(i))))] * size,
                    message_id=i + 1,
                    last=False,
                )
                for i, size in enumerate(sizes)
            )
            writer.write(frames)
            replies = []
            while len(replies) < len(sizes):
                envelope, body = await read_raw_frame(reader)
                if envelope["data"]["type"] == "MsgRegisterRes":
                    replies.append((envelope["first"], len(body)))
            writer.close()
            return replies

    assert run(main()) == [(i + 1, size) for i, size in enumerate(sizes)]


def test_pipelined_registers_are_stored_in_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fire-and-forget registers sent together are written in a few transactions (group
    commit), not one each: a request with more behind it is queued rather than written at
    once. The engine's own ``register_many`` is wrapped only to count its calls."""
    calls: list[int] = []
    real = Engine.register_many

    def counting(self: Engine, requests: Any, **options: Any) -> Any:
        calls.append(len(requests))
        return real(self, requests, **options)

    monkeypatch.setattr(Engine, "register_many", counting)
    count = 500

    async def main() -> None:
        async with running(tmp_path) as srv:
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.server.port)
            event = codec.register_event_to_sbs(NewEvent(("ff",)))
            frames = b"".join(
                raw_message("HatEventer", "MsgRegisterReq", [event], message_id=i + 1)
                for i in range(count)
            )
            marker = raw_message(
                "HatEventer", "MsgRegisterReq", [event], message_id=count + 1, last=False
            )
            calls.clear()
            writer.write(frames + marker)
            while (await read_raw_frame(reader))[0]["data"]["type"] != "MsgRegisterRes":
                pass
            writer.close()

    run(main())
    assert sum(calls) >= count + 1  # and the connection's CONNECTED event
    assert len(calls) < count // 10, f"{len(calls)} transactions for {count + 1} registers"


@pytest.mark.slow
def test_a_register_larger_than_the_lag_bound_reaches_a_subscriber_that_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One register of 100,000 events (its notification ~15 MB and its reply ~6 MB, more
    than the default 16 MiB lag bound together, both encoded off the loop) from a client
    subscribed to them: the client is not dropped, gets its reply and every event once, in
    position order, followed by the small register another client made right after."""
    count = 100_000

    async def main() -> None:
        async with (
            running(tmp_path) as srv,
            await connect(srv.address, [("big", "*")]) as client,
            await connect(srv.address) as other,
        ):
            await client.query(QueryData(max_results=0))  # the subscription is in place
            received: list[StoredEvent] = []

            async def receive_all() -> None:
                while len(received) < count + 1:
                    received.extend(await client.receive())

            receiving = asyncio.create_task(receive_all())
            big = asyncio.create_task(
                client.register_with_response(
                    [
                        NewEvent(("big", str(i % 10)), b"x" * 100, PayloadKind.BINARY)
                        for i in range(count)
                    ]
                )
            )
            await until(lambda: srv.store.last_position() >= count)
            [small] = await other.register_with_response(
                [NewEvent(("big", "after"), b"y", PayloadKind.BINARY)]
            )
            stored = await asyncio.wait_for(big, 30)
            await asyncio.wait_for(receiving, 30)
            assert all(event is not None for event in stored)
            assert [e.position for e in received] == [e.position for e in stored] + [
                small.position  # type: ignore[union-attr]
            ]
            assert client.is_open

    run(main(), timeout=60)
    assert not [line for line in warnings_of(caplog) if "slow subscriber" in line]
