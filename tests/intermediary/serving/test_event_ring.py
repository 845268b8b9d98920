"""Never-reading subscribers cost the serving loop nothing per event (issue 30, the hostile
benchmark's ``never_reading``): an event is appended once to the server's ring and every
connection reads it with a cursor (:mod:`tidings.intermediary.serving.ring`). Asserted is
behaviour, never time: with a real event server, a real intermediary and real sockets, many
subscribers that never read (a 4 KiB receive buffer, a client library holding one message)
do not keep a bystander from getting every event, in order, with each key it subscribed
under, and each of them is closed with 4008 and the documented reason once the ring drops
an event meant for it; and, unit level, who is closed when the ring is trimmed: only a
connection that lost a message of its own (its events, or a status message), while one that
skipped only others' events is moved on and kept, and what everyone passed is forgotten.
Waits are bounded only so that a broken build fails instead of hanging."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.support.chain_helpers import chain_rig
from tests.support.server_helpers import running
from tidings.client import connect as connect_server
from tidings.client import json_event
from tidings.intermediary.serving.connection import Connection, catch_up
from tidings.intermediary.serving.envelope import DROPPED_CLOSE_CODE
from tidings.intermediary.serving.ring import EventRing
from tidings.intermediary.serving.transport import TransportLimits

WAIT = 60.0
BOUND = 128 * 1024
PAD = 2 * 1024
NEVER_READERS = 12
BATCHES = 40
PER_BATCH = 10
REASON = f"too slow: more than {BOUND} bytes waiting to be sent"


async def _never_reader(url: str, port: int, keys: list[str]) -> tuple[Any, int]:
    """A subscriber that reads its hello and replies, then nothing: its socket's receive
    buffer is 4 KiB and its client library holds one message."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    ws = await websockets.connect(url, sock=sock, max_queue=1, close_timeout=1)
    hello = json.loads(await ws.recv())
    for key in keys:
        await ws.send(json.dumps({"op": "subscribe", "key": key, "events": [["app", "*"]]}))
        assert json.loads(await ws.recv())["op"] == "subscribed"
    return ws, hello["subscriber"]


@pytest.mark.sockets
def test_never_readers_are_closed_and_a_bystander_gets_every_event_in_order(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        limits = TransportLimits(
            send_buffer_bytes=4096, max_queued_messages=1_000_000, max_queued_bytes=BOUND
        )
        async with (
            running(tmp_path) as srv,
            chain_rig(srv.address, limits=limits) as rig,
            await connect_server(srv.address) as producer,
        ):
            bystander = await rig.client()
            await bystander.subscribe_events("all", [["app", "*"]])
            await bystander.subscribe_events("busy", [["app", "busy"]])
            nevers = [
                await _never_reader(rig.url, rig.server.port, ["s"] if i % 2 else ["s", "t"])
                for i in range(NEVER_READERS)
            ]
            sent: list[tuple[int, int, int]] = []
            got: dict[str, list[tuple[int, int, int]]] = {"all": [], "busy": []}
            for _ in range(BATCHES):
                batch = [json_event(("app", "busy"), {"pad": "x" * PAD}) for _ in range(PER_BATCH)]
                for event in await producer.register_with_response(batch):
                    assert event is not None
                    sent.append((event.id.server, event.id.session, event.id.instance))
                while len(got["busy"]) < len(sent):  # the bystander reads as a reader does
                    message = await bystander.message(WAIT)
                    assert message["op"] == "event" and len(message["payload"]["pad"]) == PAD
                    got[message["key"]].append(tuple(message["id"]))
            assert got["all"] == got["busy"] == sent  # everything, in order, under each key
            assert PER_BATCH * BATCHES * (PAD + 100) > 2 * BOUND  # the ring went round
            ids = {subscriber for _, subscriber in nevers}
            closed = {d.subscriber: d for d in rig.server.disconnects}
            assert ids <= closed.keys() and bystander.subscriber not in closed
            for subscriber in ids:
                assert (closed[subscriber].code, closed[subscriber].reason) == (
                    DROPPED_CLOSE_CODE,
                    REASON,
                )
            assert rig.server.counters.subscribers_dropped == NEVER_READERS
            for ws, _ in nevers:  # each sees the close, after what its buffers held
                with pytest.raises(websockets.ConnectionClosed):
                    while True:
                        await ws.recv()
                assert (ws.close_code, ws.close_reason) == (DROPPED_CLOSE_CODE, REASON)
            assert rig.server.ring.bytes <= BOUND  # one copy of each event, bounded
            await bystander.close()

    asyncio.run(asyncio.wait_for(main(), 3 * WAIT))


def _connection(subscriber: int, ring: EventRing) -> Connection:
    return Connection(subscriber, websocket=None, ring=ring, cursor=ring.end)  # type: ignore[arg-type]


def test_only_a_connection_that_lost_a_message_of_its_own_is_closed() -> None:
    ring = EventRing(max_messages=2)
    mine, others, status, fresh = (_connection(i, ring) for i in (1, 2, 3, 4))
    connections = {c.id: c for c in (mine, others, status)}
    ring.append('{"op": "event"}', {1: ("k",)})  # tick 1: one for 1, one for 9
    ring.append('{"op": "event"}', {9: ("k",)})
    assert catch_up(connections, ring) == [] and ring.start == 0
    status.cursor = ring.end  # 3 sent what it had
    ring.append('{"op": "status"}', None)  # tick 2: a status for all, then one for 9
    ring.append('{"op": "event"}', {9: ("k",)})
    assert catch_up(connections, ring) == []  # 2 earlier messages: not over the bound yet
    connections[fresh.id] = fresh  # joins at the end: nothing behind it
    fresh.cursor = ring.end
    ring.append('{"op": "event"}', {9: ("k",)})  # tick 3: 4 earlier: the oldest 2 dropped
    kicks = catch_up(connections, ring)
    assert ring.start == 2
    assert kicks == [(1, "too slow: more than 2 messages waiting to be sent")]
    assert mine.cursor == ring.end  # what waited for it is forgotten
    assert others.cursor == ring.start  # skipped only 9's: kept, moved on
    assert status.cursor == 2 and fresh.cursor == 4
    ring.append('{"op": "event"}', {9: ("k",)})  # tick 4: the status is dropped under 2
    kicks = catch_up(connections, ring)
    assert [subscriber for subscriber, _ in kicks] == [2, 3] and fresh.cursor == 4
    assert ring.start == 4  # what every connection left has passed is forgotten
