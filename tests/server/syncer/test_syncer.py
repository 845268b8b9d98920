"""The Syncer (tidings.server.syncer): real sockets on 127.0.0.1, real SQLite stores, and the
real hat-event 0.8.5 client and server for interop."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from bench.harness.processes import free_port, local_address
from tests.support.helpers import hat_event_server
from tests.support.server_helpers import async_engine, raw_message
from tests.support.waiting import run, until
from tidings.client import json_event
from tidings.events.model import EventId, NewEvent, PayloadKind, StoredEvent
from tidings.events.sources import SYNCER_SOURCE
from tidings.server.async_engine import AsyncEngine
from tidings.server.store import EventStore
from tidings.server.syncer.client import SyncerClient
from tidings.server.syncer.common import SERVER_STATUS_TYPE, client_status_type
from tidings.server.syncer.server import SyncerLimits, SyncerServer
from tidings.wire import chatter, chatter_client, codec

pytestmark = [pytest.mark.sockets, pytest.mark.timeout(120)]

LOCAL = "tcp+sbs://127.0.0.1:0"


def node(tmp_path: Path, server_id: int) -> AbstractAsyncContextManager[AsyncEngine]:
    """Server ``server_id``'s engine, without modules, on a SQLite store of its own."""
    return async_engine(tmp_path / f"server{server_id}.db", server_id=server_id)


async def register(engine: AsyncEngine, tag: str, sessions: int, size: int = 3) -> None:
    """``sessions`` sessions of ``size`` events of type ``(tag, str(session))``."""
    for session in range(sessions):
        await engine.register([json_event((tag, str(session)), {"i": i}) for i in range(size)])


def count_type(engine: AsyncEngine, event_type: tuple[str, ...]) -> int:
    return sum(1 for e in all_events(engine) if e.type == event_type)


def all_events(engine: AsyncEngine) -> list[StoredEvent]:
    return engine.store.read(0, 1_000_000)


def fingerprint(engine: AsyncEngine) -> set[tuple[object, ...]]:
    """What must be equal on synced servers: everything but the local position."""
    return {
        (e.id, e.type, e.payload, e.payload_kind, e.timestamp_us, e.source_timestamp_us)
        for e in all_events(engine)
    }


def of_type(engine: AsyncEngine, event_type: tuple[str, ...]) -> list[object]:
    return [json.loads(e.payload or b"null") for e in all_events(engine) if e.type == event_type]


async def raw_client(port: int, last: EventId, name: str = "raw") -> chatter.Connection:
    """A bare chatter connection that has sent its MsgReq."""
    connection = await chatter_client.connect(local_address(port))
    request = {"lastEventId": codec.event_id_to_sbs(last), "clientName": name}
    connection.send("HatSyncer", "MsgReq", request)
    return connection


async def receive(connection: chatter.Connection) -> chatter.Message:
    return await asyncio.wait_for(connection.receive(), 10)


async def receive_backlog(connection: chatter.Connection) -> list[list[StoredEvent]]:
    """The MsgEvents received before MsgSynced, one list per message."""
    messages: list[list[StoredEvent]] = []
    while True:
        message = await receive(connection)
        if message.type == "MsgSynced":
            return messages
        assert (message.module, message.type) == ("HatSyncer", "MsgEvents")
        messages.append(codec.events_from_sbs(message.data, "MsgEvents"))


# --- two tidings servers --------------------------------------------------------------------


def test_two_servers_sync_each_other(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a, node(tmp_path, 2) as b:
            await register(a, "a-before", 3)
            await register(b, "b-before", 2)
            server_a = await SyncerServer.start(LOCAL, a)
            server_b = await SyncerServer.start(LOCAL, b)
            client_a = SyncerClient(local_address(server_b.port), a, 2, min_delay=0.05)
            client_b = SyncerClient(local_address(server_a.port), b, 1, min_delay=0.05)
            await client_a.start()
            await client_b.start()
            # Registered while syncing, on both sides, interleaved.
            for round_ in range(3):
                await register(a, f"a-during-{round_}", 2, size=2)
                await register(b, f"b-during-{round_}", 1, size=4)
            await client_a.wait_synced(10)
            await client_b.wait_synced(10)
            await register(a, "a-after", 2)
            await register(b, "b-after", 2)

            await until(lambda: fingerprint(a) == fingerprint(b))
            events_a, events_b = all_events(a), all_events(b)
            assert len(events_a) == len(events_b) == len(fingerprint(a))
            types = {e.type[0] for e in events_a}
            assert {
                "a-before",
                "a-during-2",
                "a-after",
                "b-before",
                "b-during-2",
                "b-after",
            } <= types
            # Each server's own events kept their ids on the other (a's ids are server 1).
            assert {e.id.server for e in events_a if e.type[0].startswith("a-")} == {1}
            assert {e.id.server for e in events_b if e.type[0].startswith("b-")} == {2}
            assert of_type(a, client_status_type(2))[-1] is True
            assert of_type(b, client_status_type(1))[-1] is True
            # Who registered what on a: the Syncer its status events; b's events, synced,
            # have their source on b.
            statuses = [
                e for e in events_a if e.type[:2] == ("event", "syncer") and e.id.server == 1
            ]
            peers = [e for e in events_a if e.id.server == 2]
            sources = a.store.sources_of([e.id for e in statuses + peers])
            assert statuses and {sources[e.id] for e in statuses} == {SYNCER_SOURCE}
            assert peers and not any(e.id in sources for e in peers)

            await client_a.aclose()
            await client_b.aclose()
            await server_a.aclose()
            await server_b.aclose()

    run(main())


def test_a_session_of_many_payload_less_events_syncs(tmp_path: Path) -> None:
    """A live session of 8,000 events without payloads is one MsgEvents of 13 values in 21
    bytes an event: the peer reads it whole (its client closed the link as a protocol error
    and read the session again from the backlog, in chunks of 1,000 events, after a
    reconnect)."""

    async def main() -> None:
        async with node(tmp_path, 1) as a, node(tmp_path, 2) as b:
            server_a = await SyncerServer.start(LOCAL, a)
            client_b = SyncerClient(local_address(server_a.port), b, 1, min_delay=0.05)
            await client_b.start()
            await client_b.wait_synced(10)
            statuses = len(of_type(b, client_status_type(1)))
            await a.register([NewEvent(("tiny", "x"))] * 8_000)
            await until(lambda: count_type(b, ("tiny", "x")) == 8_000)
            assert len(of_type(b, client_status_type(1))) == statuses  # never reconnected
            assert fingerprint(b) >= {f for f in fingerprint(a) if f[1] == ("tiny", "x")}
            await client_b.aclose()
            await server_a.aclose()

    run(main())


def test_client_resumes_after_its_last_event_id(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a, node(tmp_path, 2) as b:
            server = await SyncerServer.start(LOCAL, a)
            await register(a, "first", 3)
            client = SyncerClient(local_address(server.port), b, 1, min_delay=0.05)
            await client.start()
            await client.wait_synced(10)
            await until(lambda: b.store.last_event_id(1) == a.store.last_event_id())
            await client.aclose()
            await until(lambda: server.clients == [])
            resume_from = b.store.last_event_id(1)

            await register(a, "second", 4)
            received: list[StoredEvent] = []
            original = b.register_synced

            async def spy(events: list[StoredEvent]) -> list[StoredEvent]:
                received.extend(events)
                return await original(events)

            b.register_synced = spy  # type: ignore[method-assign]
            client = SyncerClient(local_address(server.port), b, 1)
            await client.start()
            await client.wait_synced(10)
            await until(lambda: b.store.last_event_id(1) == a.store.last_event_id())

            assert received, "nothing was sent after the restart"
            assert min(e.id for e in received) > resume_from
            assert len({e.id for e in received}) == len(received)
            mine = [e for e in all_events(b) if e.id.server == 1]
            assert len(mine) == len({e.id for e in mine}) == a.store.count()
            assert {e.type for e in received if e.type[0] == "second"} == {
                ("second", str(i)) for i in range(4)
            }
            await client.aclose()
            await server.aclose()

    run(main())


# --- the server's side of the protocol, seen by a raw chatter client ------------------------


def test_backlog_one_session_per_message_then_synced_then_live(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a:
            await register(a, "small", 4, size=3)
            await register(a, "big", 1, size=7)  # larger than a backlog chunk
            await register(a, "small-again", 2, size=1)
            server = await SyncerServer.start(LOCAL, a, limits=SyncerLimits(backlog_chunk=4))
            stored = [e for e in all_events(a) if e.id.server == 1]

            connection = await raw_client(server.port, EventId(1, 0, 0))
            backlog = await receive_backlog(connection)
            for message in backlog:
                assert message
                assert len({e.id.session for e in message}) == 1
            sent = [e.id for message in backlog for e in message]
            assert sent == sorted(sent)
            # Everything stored up to the connection (later status events may follow live).
            assert sent[: len(stored)] == [e.id for e in stored]

            await a.register([json_event(("live",), 1), json_event(("live",), 2)])
            live: list[StoredEvent] = []
            while not any(e.type == ("live",) for e in live):
                message = await receive(connection)
                assert message.type == "MsgEvents"
                events = codec.events_from_sbs(message.data, "MsgEvents")
                assert len({e.id.session for e in events}) == 1
                live.extend(events)
            assert [e.id for e in live] == sorted(e.id for e in live)
            assert live[0].id > sent[-1]
            await connection.aclose()
            await server.aclose()

    run(main())


def test_backlog_resumes_within_a_session_and_skips_other_servers(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a:
            await register(a, "x", 2, size=3)
            foreign = StoredEvent(0, EventId(9, 1, 1), ("foreign",), 5, None, None, None, None)
            await a.register_synced([foreign])
            server = await SyncerServer.start(LOCAL, a)
            events = [e for e in all_events(a) if e.id.server == 1]
            middle = events[1].id

            connection = await raw_client(server.port, middle)
            sent = [e for m in await receive_backlog(connection) for e in m]
            # The server's status event for this very client comes in the backlog as well.
            assert [e.id for e in sent if e.type != SERVER_STATUS_TYPE] == [
                e.id for e in events[2:] if e.type != SERVER_STATUS_TYPE
            ]
            assert min(e.id for e in sent) == events[2].id
            await connection.aclose()

            connection = await raw_client(server.port, EventId(9, 0, 0))
            assert [e.id for m in await receive_backlog(connection) for e in m] == [foreign.id]
            await connection.aclose()
            await server.aclose()

    run(main())


def test_events_stored_during_the_backlog_arrive_once_in_order(tmp_path: Path) -> None:
    """Live events held while the backlog is read, overflowing the held list too."""

    async def main() -> None:
        async with node(tmp_path, 1) as a:
            await register(a, "old", 20, size=2)
            server = await SyncerServer.start(
                LOCAL, a, limits=SyncerLimits(backlog_chunk=3, max_pending=4)
            )

            async def writer() -> None:
                for i in range(40):
                    await a.register([json_event(("new", str(i)), i)])

            writing = asyncio.create_task(writer())
            connection = await raw_client(server.port, EventId(1, 0, 0))
            received = [e.id for m in await receive_backlog(connection) for e in m]
            await writing
            while received[-1] < a.store.last_event_id():
                message = await receive(connection)
                received.extend(e.id for e in codec.events_from_sbs(message.data, "MsgEvents"))
            assert received == sorted(set(received))
            assert received == [e.id for e in all_events(a)][: len(received)]
            await connection.aclose()
            await server.aclose()

    run(main())


def test_first_message_must_be_msgreq(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a:
            server = await SyncerServer.start(LOCAL, a)
            bad = await chatter_client.connect(local_address(server.port))
            bad.send("HatSyncer", "MsgSynced", None)
            await asyncio.wait_for(bad.wait_closed(), 10)

            good = await raw_client(server.port, EventId(1, 0, 0))
            assert await receive_backlog(good)  # the status event at least
            await good.aclose()
            await server.aclose()

    with caplog.at_level(logging.WARNING, logger="tidings.wire.chatter"):
        run(main())
    assert "first message must be HatSyncer.MsgReq, not HatSyncer.MsgSynced" in caplog.text


def test_server_status_events(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a:
            server = await SyncerServer.start(LOCAL, a)
            connection = await raw_client(server.port, EventId(1, 0, 0), name="probe")
            await receive_backlog(connection)
            await until(lambda: server.clients == [("probe", True)])
            await until(lambda: len(of_type(a, SERVER_STATUS_TYPE)) == 3)
            await connection.aclose()
            await until(lambda: len(of_type(a, SERVER_STATUS_TYPE)) == 4)
            assert server.clients == []
            assert of_type(a, SERVER_STATUS_TYPE) == [
                [],
                [{"client_name": "probe", "synced": False}],
                [{"client_name": "probe", "synced": True}],
                [],
            ]
            await server.aclose()

    run(main())


def test_close_sends_flush_request_and_accepts_the_reply(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a:
            server = await SyncerServer.start(LOCAL, a, limits=SyncerLimits(flush_timeout=10))
            connection = await raw_client(server.port, EventId(1, 0, 0))
            await receive_backlog(connection)
            started = time.monotonic()
            closing = asyncio.create_task(server.aclose())
            while True:
                message = await receive(connection)
                if message.type == "MsgFlushReq":
                    break
            assert message.first and not message.last
            connection.send(
                "HatSyncer", "MsgFlushRes", None, conversation=message.conversation, last=True
            )
            await asyncio.wait_for(closing, 10)
            assert time.monotonic() - started < 5, "the reply was not taken as the answer"
            await asyncio.wait_for(connection.wait_closed(), 10)

    run(main())


def test_close_does_not_wait_long_for_a_silent_client(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a:
            server = await SyncerServer.start(LOCAL, a, limits=SyncerLimits(flush_timeout=0.3))
            connection = await raw_client(server.port, EventId(1, 0, 0))
            await receive_backlog(connection)
            started = time.monotonic()
            await asyncio.wait_for(server.aclose(), 10)
            assert time.monotonic() - started < 3
            await connection.aclose()

    run(main())


def test_slow_client_is_disconnected_without_blocking_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a, node(tmp_path, 2) as b:
            server = await SyncerServer.start(
                LOCAL, a, limits=SyncerLimits(max_unsent_bytes=1024 * 1024)
            )
            # A client that sends its MsgReq and then never reads.
            _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            request = {
                "lastEventId": codec.event_id_to_sbs(EventId(1, 0, 0)),
                "clientName": "stuck",
            }
            writer.write(raw_message("HatSyncer", "MsgReq", request))
            await until(lambda: ("stuck", True) in server.clients)

            healthy = SyncerClient(local_address(server.port), b, 1, min_delay=0.05)
            await healthy.start()
            await healthy.wait_synced(10)

            payload = b"x" * (1024 * 1024)
            for i in range(24):
                await a.register([NewEvent(("big", str(i)), payload, PayloadKind.BINARY)])
            await until(lambda: all(name != "stuck" for name, _ in server.clients))
            await until(lambda: b.store.last_event_id(1) == a.store.last_event_id(), 30)
            assert count_type(b, ("big", "23")) == 1
            writer.close()
            await healthy.aclose()
            await server.aclose()

    with caplog.at_level(logging.WARNING, logger="tidings.wire.chatter"):
        run(main(), 60)
    assert "'stuck' is too slow" in caplog.text


def test_client_reconnects_when_the_server_restarts(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a, node(tmp_path, 2) as b:
            port = free_port()
            server = await SyncerServer.start(local_address(port), a)
            await register(a, "one", 2)
            client = SyncerClient(local_address(port), b, 1, min_delay=0.05, max_delay=0.2)
            await client.start()
            await client.wait_synced(10)
            await server.aclose()
            await until(lambda: not client.synced)
            await register(a, "two", 2)
            server = await SyncerServer.start(local_address(port), a)
            await client.wait_synced(10)
            await until(lambda: b.store.last_event_id(1) == a.store.last_event_id())
            # Each connection had events to catch up before MsgSynced: false, then true.
            assert of_type(b, client_status_type(1)) == [False, True, False, True]
            await client.aclose()
            await server.aclose()

    run(main())


# --- interop with hat-event 0.8.5 -----------------------------------------------------------


async def hat_syncer_probe(port: int) -> tuple[Any, list[Any]]:
    """The real hat-event 0.8.5 syncer client, ``hat-probe``, connected to our Syncer server
    on ``port`` from the start of server 1 and synced: the client, and the list the events it
    receives are put in (hat-event's own ``Event``s)."""
    import hat.event.common as hat_common
    import hat.event.syncer.client as hat_syncer_client

    synced = asyncio.Event()
    got: list[hat_common.Event] = []
    client = await hat_syncer_client.connect(
        local_address(port),
        "hat-probe",
        hat_common.EventId(1, 0, 0),
        synced_cb=synced.set,
        events_cb=got.extend,
    )
    await asyncio.wait_for(synced.wait(), 10)
    return client, got


def test_hat_event_syncer_client_syncs_from_our_server(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a:
            await register(a, "before", 3)
            server = await SyncerServer.start(LOCAL, a)
            client, got = await hat_syncer_probe(server.port)

            def theirs() -> list[tuple[int, int, int]]:
                return [(e.event_id.server, e.event_id.session, e.event_id.instance) for e in got]

            def ours() -> list[tuple[int, int, int]]:
                return [(e.id.server, e.id.session, e.id.instance) for e in all_events(a)]

            # Everything, in id order, once: the backlog, then live status events.
            await until(lambda: theirs() == ours())
            first = next(e for e in got if tuple(e.event_type) == ("before", "0"))
            assert first.payload.data == {"i": 0}

            await a.register([json_event(("after",), {"x": 1})])
            await until(lambda: any(tuple(e.event_type) == ("after",) for e in got))
            await until(lambda: server.clients == [("hat-probe", True)])
            started = time.monotonic()
            await server.aclose()  # the hat client answers MsgFlushReq
            assert time.monotonic() - started < 1.5
            await client.async_close()

    run(main())


def test_our_client_syncs_from_a_hat_event_server(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import hat.event.common as hat_common
    import hat.event.eventer as hat_eventer

    async def main(eventer_port: int, syncer_port: int, process: subprocess.Popen[bytes]) -> None:
        async with node(tmp_path, 1) as a:
            eventer = await hat_eventer.connect(local_address(eventer_port))
            results = await eventer.register_with_response(
                [
                    hat_common.RegisterEvent(
                        event_type=("hat", str(i)),
                        source_timestamp=hat_common.now(),
                        payload=hat_common.EventPayload(
                            type=hat_common.EventPayloadType.JSON, data={"i": i}
                        ),
                    )
                    for i in range(3)
                ]
            )
            expected = {
                (e.event_id.server, e.event_id.session, e.event_id.instance): tuple(e.event_type)
                for e in results
            }
            client = SyncerClient(local_address(syncer_port), a, 7, min_delay=0.1)
            await client.start()
            await client.wait_synced(15)

            def arrived() -> dict[tuple[int, int, int], tuple[str, ...]]:
                return {
                    (e.id.server, e.id.session, e.id.instance): e.type
                    for e in all_events(a)
                    if e.id.server == 7 and e.type[0] == "hat"
                }

            # lmdb flushes every second; the syncer serves flushed events only.
            await until(lambda: arrived() == expected, 15)
            assert of_type(a, ("hat", "1")) == [{"i": 1}]
            assert of_type(a, ("event", "engine")) == ["STARTED"]
            assert of_type(a, client_status_type(7))[-1] is True

            eventer.register([hat_common.RegisterEvent(("hat", "live"), None, None)])
            await until(lambda: count_type(a, ("hat", "live")) == 1, 15)
            await eventer.async_close()

            # On shutdown the hat server flushes its syncer clients: we must answer.
            started = time.monotonic()
            process.terminate()
            assert await asyncio.to_thread(process.wait, 15) == 0
            assert time.monotonic() - started < 5
            await until(lambda: not client.synced)
            await client.aclose()

    with (
        caplog.at_level(logging.DEBUG, logger="tidings.server.syncer"),
        hat_event_server(tmp_path, 7) as (eventer_port, syncer_port, process),
    ):
        run(main(eventer_port, syncer_port, process), 60)
    assert "syncer client of server 7: answered MsgFlushReq" in caplog.text


def test_events_another_process_appends_reach_subscribers_and_peers_in_order(
    tmp_path: Path,
) -> None:
    """A second store on the served database (as a relay's event-store target would be)
    appends between our own sessions: a subscriber and a syncing peer get everything, once,
    in position order, both when our next write reveals the gap and when the server is
    idle (the poll)."""

    async def main() -> None:
        async with node(tmp_path, 1) as a, node(tmp_path, 2) as b:
            outside = EventStore(f"sqlite:///{tmp_path / 'server1.db'}", 1)
            heard: list[int] = []
            a.subscribe(lambda events: heard.extend(e.position for e in events))
            server = await SyncerServer.start(LOCAL, a)
            client = SyncerClient(local_address(server.port), b, 1, min_delay=0.05)
            try:
                await client.start()
                await client.wait_synced(10)
                await a.register([json_event(("own",), {"n": 1})])
                await asyncio.to_thread(outside.register, [NewEvent(("outside",))])
                await a.register([json_event(("own",), {"n": 2})])  # reveals the gap
                await asyncio.to_thread(outside.register, [NewEvent(("outside", "idle"))])
                await until(lambda: fingerprint(a) <= fingerprint(b))
                last = a.store.last_position()
                await until(lambda: heard[-1:] == [last])
                assert heard == sorted(set(heard))
                assert {e.type for e in all_events(b)} >= {("outside",), ("outside", "idle")}
            finally:
                await client.aclose()
                await server.aclose()
                outside.close()

    run(main())


def test_closing_a_client_keeps_the_closers_own_cancellation(tmp_path: Path) -> None:
    """A Monitor link closing its peers may itself be cancelled meanwhile (the server stops):
    the cancellation must reach it, not be taken for the client task's own and dropped,
    which left the server's shutdown waiting for ever."""

    async def main() -> bool:
        async with async_engine(tmp_path / "events.db") as engine:
            client = SyncerClient(local_address(free_port()), engine, 2, min_delay=0.05)
            await client.start()
            await asyncio.sleep(0.1)  # retrying an address nobody listens on
            closing = asyncio.ensure_future(client.aclose())
            await asyncio.sleep(0)  # aclose is waiting for the client's task now
            closing.cancel()
            try:
                await closing
            except asyncio.CancelledError:
                return True
            return False

    assert run(main()) is True


def test_sessions_waiting_together_are_stored_together_and_heard_one_by_one(
    tmp_path: Path,
) -> None:
    """A backlog of one-session MsgEvents is stored in a few transactions, not one per
    session (a busy peer fell seconds behind that way), and the receiving server's listeners
    still hear of each session alone, in order."""

    async def main() -> tuple[int, list[list[int]], int, int]:
        async with node(tmp_path, 1) as a, node(tmp_path, 2) as b:
            server = await SyncerServer.start(LOCAL, a)
            await register(a, "many", 300, size=1)
            calls = 0
            original = b.register_synced

            async def spy(events: list[StoredEvent]) -> list[StoredEvent]:
                nonlocal calls
                calls += 1
                return await original(events)

            b.register_synced = spy  # type: ignore[method-assign]
            heard: list[list[int]] = []
            b.subscribe(
                lambda events: heard.append([e.id.session for e in events if e.id.server == 1])
            )
            client = SyncerClient(local_address(server.port), b, 1)
            await client.start()
            await client.wait_synced(10)
            await until(lambda: b.store.last_event_id(1) == a.store.last_event_id())
            stored = [e for e in all_events(b) if e.id.server == 1]
            total = a.store.count()
            await client.aclose()
            await server.aclose()
            return calls, heard, len(stored), total

    calls, heard, stored, total = run(main())
    assert stored == total
    assert calls < 100, f"{calls} register_synced calls for 300 one-session messages"
    mine = [sessions for sessions in heard if sessions]
    assert all(len(set(sessions)) == 1 for sessions in mine)
    flat = [sessions[0] for sessions in mine]
    assert flat == sorted(flat) and len(flat) == len(set(flat))
