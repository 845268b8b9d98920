"""The Syncer's outbox-id extension (tidings.server.syncer.common): its wire format, how the
peers agree on it, and that an outbox event reaching a server from the relay and from a
peer is stored and notified once. Real sockets on 127.0.0.1, real SQLite stores, in this
process; the worst case with processes killed is in test_outbox_failover.py."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import pytest

from bench.harness.processes import local_address
from tests.server.syncer.test_syncer import (
    LOCAL,
    all_events,
    hat_syncer_probe,
    node,
    raw_client,
    receive,
)
from tests.support.helpers import hat_event_server
from tests.support.waiting import run, until
from tidings import client
from tidings.events.model import EventId, NewEvent, PayloadKind, StoredEvent
from tidings.server.async_engine import AsyncEngine
from tidings.server.eventer.server import EventerServer
from tidings.server.syncer.client import SyncerClient
from tidings.server.syncer.common import (
    OUTBOX_IDS_MARK,
    encode_outbox_events,
    mark_client_name,
    outbox_events_from_sbs,
    parse_client_name,
)
from tidings.server.syncer.server import SyncerServer
from tidings.wire import codec

pytestmark = [pytest.mark.sockets, pytest.mark.timeout(120)]


def outbox_event(outbox_id: str, n: int = 0) -> NewEvent:
    return client.json_event(("orders", "created"), {"n": n}, outbox_event_id=outbox_id)


def copies(engine: AsyncEngine, outbox_id: str) -> list[StoredEvent]:
    """The events of ``engine``'s store that came from outbox event ``outbox_id``."""
    return [e for e in all_events(engine) if e.outbox_event_id == outbox_id]


# --- the wire --------------------------------------------------------------------------------


def test_outbox_events_encode_as_hat_sbs_does_and_decode_back() -> None:
    events = [
        StoredEvent(1, EventId(1, 2, 3), ("a", "b"), 1_700_000_000_123_456, None, None, None, "x"),
        StoredEvent(2, EventId(1, 2, 4), ("a",), 5, 7, b'{"v": 1}', PayloadKind.JSON, None),
        StoredEvent(3, EventId(1, 3, 1), ("c",), 6, None, b"\x00\xff", PayloadKind.BINARY, "é/1"),
    ]
    body = encode_outbox_events(events)
    decoded = codec.decode(codec.TIDINGS_SYNCER, "MsgEvents", body, from_server=True)
    # hat-sbs, given the decoded value, writes the very same bytes.
    assert codec.REPOSITORY.encode(codec.TIDINGS_SYNCER, "MsgEvents", decoded) == body
    # Positions are the receiver's to assign; everything else travels.
    assert outbox_events_from_sbs(decoded) == [replace(e, position=0) for e in events]


def test_the_mark_is_added_and_read_back() -> None:
    assert parse_client_name(mark_client_name("2")) == ("2", True)
    assert parse_client_name("hat-probe") == ("hat-probe", False)
    assert mark_client_name("2").startswith("2") and OUTBOX_IDS_MARK not in "2"


# --- the agreement, seen by raw clients ------------------------------------------------------


def test_only_a_client_that_asks_is_sent_outbox_ids(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a:
            await a.register([outbox_event("o-1", 1), outbox_event("o-2", 2)])
            await a.register([client.json_event(("plain",), 3)])
            server = await SyncerServer.start(LOCAL, a)
            marked = await raw_client(server.port, EventId(1, 0, 0), mark_client_name("peer"))
            plain = await raw_client(server.port, EventId(1, 0, 0), "hat-like")

            async def backlog(connection) -> list[tuple[str, list[StoredEvent]]]:
                got = []
                while (message := await receive(connection)).type != "MsgSynced":
                    if message.module == codec.TIDINGS_SYNCER:
                        got.append((message.module, outbox_events_from_sbs(message.data)))
                    else:
                        events = codec.events_from_sbs(message.data, "MsgEvents")
                        got.append((message.module, events))
                return got

            def ours(got: list[tuple[str, list[StoredEvent]]]) -> list[StoredEvent]:
                """The test's events (the syncer's status events come too, as they happen)."""
                return [e for _, events in got for e in events if e.type[0] != "event"]

            extended = await backlog(marked)
            assert {module for module, _ in extended} == {codec.TIDINGS_SYNCER}
            ids = [e.outbox_event_id for e in ours(extended)]
            assert ids == ["o-1", "o-2", None]
            hat = await backlog(plain)
            assert {module for module, _ in hat} == {codec.SYNCER}
            assert [e.id for e in ours(hat)] == [e.id for e in ours(extended)]
            assert [e.outbox_event_id for e in ours(hat)] == [None] * 3

            # Live events too, each in the form its client asked for.
            await a.register([outbox_event("o-3", 3)])

            async def next_order(connection) -> tuple[str, StoredEvent]:
                """The next live ``orders`` event (the syncer's status events come too)."""
                while True:
                    message = await receive(connection)
                    if message.module == codec.TIDINGS_SYNCER:
                        events = outbox_events_from_sbs(message.data)
                    else:
                        events = codec.events_from_sbs(message.data, "MsgEvents")
                    for event in events:
                        if event.type[0] == "orders":
                            return message.module, event

            module, event = await next_order(marked)
            assert (module, event.outbox_event_id) == (codec.TIDINGS_SYNCER, "o-3")
            module, event = await next_order(plain)
            assert (module, event.outbox_event_id) == (codec.SYNCER, None)
            # The status event names the client without the mark.
            await until(lambda: sorted(server.clients) == [("hat-like", True), ("peer", True)])
            await marked.aclose()
            await plain.aclose()
            await server.aclose()

    run(main())


# --- two tidings servers, each also written to by the relay ---------------------------------


class Pair:
    """Two tidings servers (ids 1 and 2), each with its Eventer and Syncer server, syncing
    each other, and a subscriber to ``orders`` events on each."""

    def __init__(self, engines: tuple[AsyncEngine, AsyncEngine]) -> None:
        self.engines = engines
        self.eventers: list[EventerServer] = []
        self.notified: list[Counter[str]] = [Counter(), Counter()]

    async def start(self, stack: AsyncExitStack) -> None:
        syncers = []
        for engine in self.engines:
            eventer = await EventerServer.start(LOCAL, engine)
            stack.push_async_callback(eventer.aclose)
            self.eventers.append(eventer)
            syncer = await SyncerServer.start(LOCAL, engine)
            stack.push_async_callback(syncer.aclose)
            syncers.append(syncer)
        for index, engine in enumerate(self.engines):
            other = 1 - index
            peer = SyncerClient(local_address(syncers[other].port), engine, other + 1)
            await peer.start()
            stack.push_async_callback(peer.aclose)
            subscriber = await client.connect(local_address(self.eventers[index].port))
            stack.push_async_callback(subscriber.aclose)
            await subscriber.subscribe([("orders", "*")])
            task = asyncio.create_task(self._count(subscriber, self.notified[index]))
            stack.callback(task.cancel)

    @staticmethod
    async def _count(subscriber: client.Client, counter: Counter[str]) -> None:
        while True:
            for event in await subscriber.receive():
                counter[client.json_value(event)["id"]] += 1

    async def relay(self, index: int, outbox_ids: list[str]) -> list[StoredEvent | None]:
        """Publish ``outbox_ids`` to server ``index`` as the relay's event_server target does."""
        async with await client.connect(local_address(self.eventers[index].port)) as relay:
            events = [
                client.json_event(("orders", "created"), {"id": o}, outbox_event_id=o)
                for o in outbox_ids
            ]
            return await relay.register_outbox(events)

    def once_everywhere(self, outbox_ids: list[str]) -> bool:
        return all(
            len(copies(engine, o)) == 1 and self.notified[index][o] == 1
            for index, engine in enumerate(self.engines)
            for o in outbox_ids
        )


def test_an_event_from_the_relay_and_then_from_a_peer_is_stored_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, 1) as a, node(tmp_path, 2) as b, AsyncExitStack() as stack:
            pair = Pair((a, b))
            await pair.start(stack)
            # The relay reaches B first; A gets it later (the relay resending there).
            (at_b,) = await pair.relay(1, ["e-1"])
            await until(lambda: len(copies(a, "e-1")) == 1)
            (at_a,) = await pair.relay(0, ["e-1"])
            assert at_b is not None and at_a is not None
            # A already had it, from B's Syncer: the relay is answered with B's event.
            assert at_a.id == at_b.id and at_a.id.server == 2
            await until(lambda: pair.once_everywhere(["e-1"]))
            # Later events still sync, so the Syncer did not stop at the duplicate.
            await pair.relay(0, ["e-2"])
            await until(lambda: pair.once_everywhere(["e-1", "e-2"]))
            await asyncio.sleep(0.5)  # nothing more arrives late
            assert pair.once_everywhere(["e-1", "e-2"])

    run(main())


def test_events_sent_to_both_servers_at_once_are_stored_once_in_each(tmp_path: Path) -> None:
    """The relay publishing the same outbox events to both servers at the same time (the
    converse race): each store keeps the copy it got first, and skips the other's."""

    async def main() -> None:
        async with node(tmp_path, 1) as a, node(tmp_path, 2) as b, AsyncExitStack() as stack:
            pair = Pair((a, b))
            await pair.start(stack)
            outbox_ids = [f"both-{n}" for n in range(60)]
            batches = [outbox_ids[i : i + 5] for i in range(0, len(outbox_ids), 5)]
            await asyncio.gather(
                *(pair.relay(index, batch) for batch, index in itertools.product(batches, (0, 1)))
            )
            await until(lambda: pair.once_everywhere(outbox_ids), 20)
            await asyncio.sleep(0.5)
            assert pair.once_everywhere(outbox_ids)
            # Every outbox event is held once per store, and nothing else came in twice.
            for engine in (a, b):
                orders = [e for e in all_events(engine) if e.type == ("orders", "created")]
                assert sorted(e.outbox_event_id or "" for e in orders) == sorted(outbox_ids)

    run(main())


# --- a hat-event 0.8.5 peer ------------------------------------------------------------------


def test_a_hat_event_peer_syncs_as_before_and_sees_the_marked_name(tmp_path: Path) -> None:
    """hat-event 0.8.5 as our syncer client gets plain events, outbox events included; as
    our syncer server it is sent the marked name, and shows it in its status event."""
    import hat.event.common as hat_common
    import hat.event.eventer as hat_eventer

    async def main(eventer_port: int, syncer_port: int) -> None:
        async with node(tmp_path, 1) as a:
            await a.register([outbox_event("o-1", 1), outbox_event("o-2", 2)])
            server = await SyncerServer.start(LOCAL, a)
            hat_client, got = await hat_syncer_probe(server.port)
            await until(lambda: sum(e.event_type[0] == "orders" for e in got) == 2)
            assert [e.payload.data for e in got if e.event_type[0] == "orders"] == [
                {"n": 1},
                {"n": 2},
            ]
            assert server.clients == [("hat-probe", True)]

            ours = SyncerClient(local_address(syncer_port), a, 7, min_delay=0.1)
            await ours.start()
            await ours.wait_synced(15)
            eventer = await hat_eventer.connect(local_address(eventer_port))
            query = hat_common.QueryData(event_types=[("event", "syncer", "server")], max_results=1)
            expected = [{"client_name": mark_client_name("1"), "synced": True}]
            for _ in range(150):  # lmdb serves what it flushed, every second
                status = await eventer.query(query)
                if status and status[0].payload.data == expected:
                    break
                await asyncio.sleep(0.1)
            assert status[0].payload.data == expected
            await eventer.async_close()
            await ours.aclose()
            await hat_client.async_close()
            await server.aclose()

    with hat_event_server(tmp_path, 7) as (eventer_port, syncer_port, _):
        run(main(eventer_port, syncer_port), 60)
