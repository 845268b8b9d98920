"""The byte bound of what waits for one subscriber (``max_queued_bytes``, issue 30), with a
real event server, a real intermediary and a real client that never reads (its receive
buffer 4 KiB, its client library holding one message): what waits for it never weighs more
than the bound plus one message, whatever the count bound allows; past it the connection is
closed with 4008 and a reason naming the bound, counted as a subscriber dropped, while a
subscriber that reads gets every event. No test asserts timings: waits are bounded only so
that a broken build fails instead of hanging."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
import websockets

from tests.support.chain_helpers import chain_rig
from tests.support.server_helpers import running
from tidings.client import connect as connect_server
from tidings.client import json_event
from tidings.intermediary.serving.connection import Connection
from tidings.intermediary.serving.envelope import DROPPED_CLOSE_CODE
from tidings.intermediary.serving.ring import EventRing
from tidings.intermediary.serving.transport import TransportLimits

pytestmark = pytest.mark.sockets

WAIT = 60.0
BOUND = 64 * 1024
PAD = 8 * 1024


def test_a_never_reader_holds_at_most_the_bound_and_is_closed_past_it(tmp_path: Path) -> None:
    async def main() -> None:
        limits = TransportLimits(
            send_buffer_bytes=4096, max_queued_messages=1_000_000, max_queued_bytes=BOUND
        )
        async with (
            running(tmp_path) as srv,
            chain_rig(srv.address, limits=limits) as rig,
            await connect_server(srv.address) as producer,
        ):
            good = await rig.client()
            await good.subscribe_events("all", [["app", "*"]])
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", rig.server.port))
            never = await websockets.connect(rig.url, sock=sock, max_queue=1)
            hello = json.loads(await never.recv())
            await never.send(json.dumps({"op": "subscribe", "key": "s", "events": [["app", "*"]]}))
            assert json.loads(await never.recv())["op"] == "subscribed"
            conn: Connection = rig.server.connections[hello["subscriber"]]
            heaviest = 0

            async def weigh() -> None:
                nonlocal heaviest
                while True:
                    heaviest = max(heaviest, conn.queued_bytes)
                    await asyncio.sleep(0)

            weighing = asyncio.create_task(weigh())
            sent = 0
            while not any(d.subscriber == hello["subscriber"] for d in rig.server.disconnects):
                batch = [json_event(("app", "x"), {"pad": "x" * PAD}) for _ in range(5)]
                sent += len([e for e in await producer.register_with_response(batch) if e])
                for _ in range(5):
                    message = await good.message(WAIT)
                    assert message["op"] == "event" and len(message["payload"]["pad"]) == PAD
            weighing.cancel()
            assert sent > BOUND // PAD  # more than the bound was sent its way
            assert 0 < heaviest <= BOUND + PAD + 200  # the bound plus one message at most
            record = next(d for d in rig.server.disconnects if d.subscriber == hello["subscriber"])
            assert record.code == DROPPED_CLOSE_CODE
            assert record.reason == f"too slow: more than {BOUND} bytes waiting to be sent"
            assert rig.server.counters.subscribers_dropped == 1
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    await never.recv()
            assert never.close_code == DROPPED_CLOSE_CODE and never.close_reason == record.reason
            # The reader's backlog is weighed down to nothing as it is sent.
            reader = next(c for c in rig.server.connections.values() if c is not conn)
            assert reader.queued_bytes == 0 and reader.cursor == rig.server.ring.end
            await good.close()

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_the_weight_follows_the_ring_from_the_cursor_and_the_views() -> None:
    """The bookkeeping the bound reads: the ring's bytes from the connection's cursor
    (whoever they are for), and a view replaced by a newer one of its key weighs as the
    newer one."""
    ring = EventRing(max_messages=100, max_bytes=None)
    conn = Connection(1, websocket=None, ring=ring, cursor=ring.end)  # type: ignore[arg-type]
    event = json.dumps({"op": "event", "payload": "x" * 100})
    ring.append(event, {1: ("k",)})
    ring.append(event, {2: ("k",)})  # another's: in the ring from this cursor, weighed too
    assert conn.queued_bytes == 2 * len(event)
    conn.queue({"op": "view", "key": "v", "rows": [[1]]})
    first_view = conn.views["v"]
    conn.queue({"op": "view", "key": "v", "rows": [[1, 2, 3]]})
    assert conn.replaced == 1
    assert conn.queued_bytes == 2 * len(event) + len(conn.views["v"]) != len(first_view)
    conn.queue({"op": "view", "key": "v", "unchanged": True})  # the pending one stays
    assert conn.queued_bytes == 2 * len(event) + len(conn.views["v"])
    conn.drop_queued()
    assert conn.queued_bytes == 0 and conn.cursor == ring.end and not conn.views
