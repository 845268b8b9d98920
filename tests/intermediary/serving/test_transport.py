"""The intermediary over real sockets (issue 12 item 7): uvicorn on a free port, the Python
client and raw websockets clients; a spatial simulation upstream. No test asserts timings:
waits are bounded only so that a broken build fails instead of hanging."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import websockets

from tests.support.intermediary_helpers import SMALL, WHOLE, WORLD, inside
from tidings.errors import IntermediaryError
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.client.subscriber import ReceivedFrame
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.generation import FrameKind, decode_frame
from tidings.intermediary.node.intermediary import Intermediary
from tidings.intermediary.node.scheduling import Scheduler
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.regions.coverage import covers
from tidings.intermediary.regions.geometry import Box, Sphere
from tidings.intermediary.serving.envelope import DROPPED_CLOSE_CODE, open_envelope
from tidings.intermediary.serving.transport import IntermediaryServer, TransportLimits

pytestmark = pytest.mark.sockets

INNER = {"box": {"lo": [25, 35], "hi": [35, 45]}}
NEAR_7 = {"sphere": {"center": [0, 0], "radius": 20}, "relative_to": 7}
WAIT = 60.0


class Rig:
    """A simulation, an intermediary and its server; ``history[epoch]`` is every agent's
    position in the batch that made that epoch."""

    def __init__(
        self, n: int = 300, *, max_dropped: int = 50, limits: TransportLimits | None = None
    ):
        self.sim = Simulation(n, WORLD, max_speed=5.0, seed=3)
        self.feed = self.sim.feed()
        self.node = Intermediary(
            2, self.feed, world=WORLD, scheduler=Scheduler(max_dropped=max_dropped)
        )
        self.history: dict[int, np.ndarray] = {}
        self.server = IntermediaryServer(self.node, source=self.source, tick_s=0.01, limits=limits)

    def source(self) -> list[UpdateBatch]:
        self.sim.step(0.05)
        self.history[self.node.state.epoch + 1] = self.sim.positions.copy()
        return [self.feed.batch()]

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}/"


def run(body: Callable[[Rig], Awaitable[None]], **options: Any) -> None:
    async def main() -> None:
        rig = Rig(**options)
        await rig.server.start()
        try:
            await asyncio.wait_for(body(rig), WAIT)
        finally:
            await rig.server.aclose()

    asyncio.run(main())


async def until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.01)


async def slow_subscriber(rig: Rig) -> tuple[websockets.ClientConnection, dict[str, Any]]:
    """A raw subscriber with a 4 KiB receive buffer that takes one message at a time,
    subscribed to the whole world at 200 Hz: its connection, and its hello."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", rig.server.port))
    slow = await websockets.connect(rig.url, sock=sock, max_queue=1)
    hello = json.loads(await slow.recv())
    await slow.send(json.dumps({"op": "subscribe", "key": "all", "region": WHOLE, "rate_hz": 200}))
    while not isinstance(reply := await slow.recv(), str):
        pass
    assert json.loads(reply)["op"] == "subscribed"
    return slow, hello


async def views(client: IntermediaryClient, count: int) -> list[ReceivedFrame]:
    """The next ``count`` VIEW frames (EMPTY and UNCHANGED skipped)."""
    got: list[ReceivedFrame] = []
    async for frame in client.frames():
        if frame.header.kind is FrameKind.VIEW:
            got.append(frame)
            if len(got) == count:
                break
    return got


def test_three_subscribers_get_views_equal_to_a_brute_force_selection() -> None:
    async def body(rig: Rig) -> None:
        specs = {"whole": WHOLE, "small": SMALL, "near": NEAR_7}
        a = await IntermediaryClient.connect(rig.url)
        b = await IntermediaryClient.connect(rig.url)
        c = await IntermediaryClient.connect(rig.url)
        await a.subscribe("whole", WHOLE, rate_hz=200)
        await b.subscribe("small", SMALL, rate_hz=200, capabilities={"compress": True})
        await c.subscribe(
            "near", NEAR_7, rate_hz=200, capabilities={"relative": True, "float32": True}
        )
        for client in (a, b, c):
            for frame in await views(client, 5):
                positions = rig.history[frame.header.epoch]
                np.testing.assert_array_equal(
                    frame.ids, np.flatnonzero(inside(positions, specs[frame.key]))
                )
                np.testing.assert_allclose(frame.world_positions(), positions[frame.ids], atol=1e-3)
        for client in (a, b, c):
            await client.close()

    run(body)


def test_a_covered_subscriber_adds_nothing_upstream_and_unsubscribing_shrinks_it() -> None:
    async def body(rig: Rig) -> None:
        a = await IntermediaryClient.connect(rig.url)
        b = await IntermediaryClient.connect(rig.url)
        reply = await a.subscribe("big", SMALL)
        assert reply["covered"] is False
        before = rig.feed.boxes
        assert before
        reply = await b.subscribe("inner", INNER)
        assert reply["covered"] is True
        assert rig.feed.boxes == before
        assert (await a.unsubscribe("big"))["removed"] == 1
        await until(lambda: rig.feed.boxes != before)
        assert sum(box.volume() for box in rig.feed.boxes) < sum(box.volume() for box in before)
        assert covers(list(rig.feed.boxes), Box((25.0, 35.0), (35.0, 45.0)))
        assert not covers(list(rig.feed.boxes), Sphere((30.0, 40.0), 15.0))
        await a.close()
        await b.close()

    run(body)


def test_bad_requests_get_an_error_and_the_connection_keeps_working() -> None:
    async def body(rig: Rig) -> None:
        client = await IntermediaryClient.connect(rig.url)
        bad = [
            {"sphere": {"center": [math.nan, 1], "radius": 3}},
            {"cube": {"lo": [0, 0], "hi": [1, 1]}},
            {"sphere": {"center": [0, 0], "radius": 1e300}},
        ]
        for region in bad:
            with pytest.raises(IntermediaryError):
                await client.subscribe("k", region)
        for request in ({"op": "fly"}, {"op": "subscribe", "key": "k", "region": SMALL, "x": 1}):
            with pytest.raises(IntermediaryError):
                await client.request(request)
        async with websockets.connect(rig.url) as raw:
            await raw.recv()  # hello
            for message in ("not json", b"\x00binary", "[1, 2]"):
                await raw.send(message)
                assert json.loads(await raw.recv())["op"] == "error"
        assert rig.node.publishers.subscribers() == []
        await client.subscribe("k", SMALL, rate_hz=200)
        assert len(await views(client, 2)) == 2
        await client.close()

    run(body)


def test_absurd_values_get_a_clear_error_each_and_the_connection_goes_on() -> None:
    """JSON a hostile subscriber can write that Python parses into values no check expected:
    integers beyond float, NaN and Infinity literals, nesting deeper than the parser's
    recursion, entity ids the state cannot hold."""
    big = "1" + "0" * 400
    small, near = json.dumps(SMALL), '"sphere": {"center": [0, 0], "radius": 5}'

    def subscribe(region: str, extra: str = "") -> str:
        return f'{{"op": "subscribe", "key": "k", "region": {region}{extra}}}'

    texts = [
        subscribe(small, f', "priority": {big}'),
        subscribe(small, f', "rate_hz": {big}'),
        subscribe(small, ', "priority": NaN'),
        subscribe(small, ', "rate_hz": Infinity'),
        subscribe(f'{{"box": {{"lo": [0, 0], "hi": [{big}, 1]}}}}'),
        subscribe(f'{{{near}, "relative_to": {big}}}'),
        subscribe(f'{{{near}, "relative_to": "ship-7"}}'),
        subscribe("[" * 30_000 + "]" * 30_000),
        "[" * 60_000,
    ]

    async def body(rig: Rig) -> None:
        async with websockets.connect(rig.url, max_size=None) as raw:
            await raw.recv()  # hello
            for text in texts:
                await raw.send(text)
                reply = json.loads(await raw.recv())
                assert reply["op"] == "error" and reply["message"], (text[:80], reply)
            assert rig.node.publishers.subscribers() == []
            await raw.send(json.dumps({"op": "subscribe", "key": "k", "region": SMALL}))
            assert json.loads(await raw.recv())["op"] == "subscribed"

    run(body)


def test_requests_over_the_rate_are_refused() -> None:
    async def body(rig: Rig) -> None:
        client = await IntermediaryClient.connect(rig.url)
        refused = 0
        for i in range(10):
            try:
                await client.subscribe(f"k{i}", SMALL)
            except IntermediaryError as exc:
                assert "too many requests" in str(exc)
                refused += 1
        assert refused > 0
        await client.close()

    run(body, limits=TransportLimits(requests_per_s=1e-3, burst=3))


def test_a_subscriber_that_never_reads_is_dropped_with_a_reason_while_another_goes_on() -> None:
    async def body(rig: Rig) -> None:
        good = await IntermediaryClient.connect(rig.url)
        await good.subscribe("k", SMALL, rate_hz=100)
        slow, hello = await slow_subscriber(rig)
        # Now it never reads: its buffers fill, its frames are dropped, then it is closed.
        seen = 0

        async def keep_reading() -> None:
            nonlocal seen
            async for _ in good.frames():
                seen += 1

        reader = asyncio.create_task(keep_reading())
        await until(
            lambda: any(d.subscriber == hello["subscriber"] for d in rig.server.disconnects)
        )
        after = seen
        await until(lambda: seen > after + 3)  # the other subscriber still gets frames
        record = next(d for d in rig.server.disconnects if d.subscriber == hello["subscriber"])
        assert record.code == DROPPED_CLOSE_CODE and "consecutive" in record.reason
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                await slow.recv()
        assert slow.close_code == DROPPED_CLOSE_CODE
        assert slow.close_reason == record.reason
        assert hello["subscriber"] not in rig.node.publishers.subscribers()
        reader.cancel()
        await good.close()

    run(body, n=400, max_dropped=3, limits=TransportLimits(send_buffer_bytes=4096))


def test_frames_that_wait_for_a_full_transport_arrive_whole_and_in_order() -> None:
    # A round sends to an idle connection directly; a send that must wait for the transport
    # (this subscriber stops reading until its buffers fill) is finished by the writer. The
    # frames it then reads are whole, for its key, and in epoch order.
    async def body(rig: Rig) -> None:
        slow, hello = await slow_subscriber(rig)
        conn = rig.server.connections[hello["subscriber"]]
        # A direct send that had to wait, seen as the round leaves it (the writer may take
        # it over before a poll would see it).
        waited: list[bool] = []
        send_now = conn.send_now

        def watched() -> bool:
            sent = send_now()
            waited.append(conn.pending is not None)
            return sent

        conn.send_now = watched  # type: ignore[method-assign]
        await until(lambda: any(waited))  # a direct send is waiting
        epochs = []
        while len(epochs) < 20:
            message = await slow.recv()
            assert isinstance(message, bytes)
            key, frame = open_envelope(message)
            assert key == "all"
            header, ids, _ = decode_frame(frame)
            if header.kind is FrameKind.VIEW:
                assert len(ids) == 400
            epochs.append(header.epoch)
        assert epochs == sorted(epochs)
        assert not rig.server.disconnects
        await slow.close()

    run(body, n=400, max_dropped=1000, limits=TransportLimits(send_buffer_bytes=4096))


def test_an_oversized_message_closes_with_1009_and_a_full_server_refuses_with_1013() -> None:
    async def body(rig: Rig) -> None:
        async with websockets.connect(rig.url) as big:
            await big.recv()  # hello
            await big.send("x" * 5000)
            with pytest.raises(websockets.ConnectionClosed):
                await big.recv()
            assert big.close_code == 1009
        await until(lambda: not rig.server.connections)
        first = await IntermediaryClient.connect(rig.url)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            async with websockets.connect(rig.url) as second:
                await second.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        await first.subscribe("k", SMALL)
        await first.close()

    run(body, limits=TransportLimits(max_message_bytes=4096, max_connections=1))


class _Buggy(IntermediaryServer):
    """A fake for a fault no real request produces on demand: a bug met by ``op: explode``."""

    async def handle_request(
        self, subscriber: int, request: dict[str, object]
    ) -> dict[str, object]:
        if request.get("op") == "explode":
            raise KeyError("a bug")
        return await super().handle_request(subscriber, request)


def test_a_request_that_meets_a_bug_is_answered_and_logged_once_not_per_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 30: a peer repeating a request that fails must not write a traceback each
    time; and the connection goes on (it used to close without a word)."""

    async def body(rig: Rig) -> None:
        async with websockets.connect(rig.url) as raw:
            await raw.recv()  # hello
            for _ in range(20):
                await raw.send(json.dumps({"op": "explode", "key": "k"}))
                reply = json.loads(await raw.recv())
                assert reply == {
                    "op": "error",
                    "message": "request: failed (the intermediary's log says why)",
                    "key": "k",
                }
            await raw.send(json.dumps({"op": "subscribe", "key": "k", "region": SMALL}))
            assert json.loads(await raw.recv())["op"] == "subscribed"

    async def main() -> None:
        rig = Rig()
        rig.server = _Buggy(rig.node, source=rig.source, tick_s=0.01)
        await rig.server.start()
        try:
            await asyncio.wait_for(body(rig), WAIT)
        finally:
            await rig.server.aclose()

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    failed = [r for r in caplog.records if "a request failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None
