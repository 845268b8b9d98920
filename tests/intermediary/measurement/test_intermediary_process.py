"""One intermediary process of a fan-out measurement
(``python -m tidings.intermediary.measurement.intermediary_process``) as a real process, fed by
a publisher on a real socket: it serves a subscriber, exits 0 when its stdin closes and 3,
naming the upstream, when the publisher goes away. Views are checked against the publisher's
brute force (the helpers of :mod:`tests.intermediary.feed.test_remote`)."""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
import pytest

from tests.intermediary.feed.test_remote import LEFT, WAIT, Recorded, connection, in_union, serve
from tests.support.intermediary_helpers import WORLD, inside
from tests.support.waiting import until
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.client.subscriber import ReceivedFrame
from tidings.intermediary.node.generation import FrameKind
from tidings.intermediary.publisher.server import SimulationServer

server = pytest.mark.sockets


# -- the fan-out node as a real process ----------------------------------------------------


async def start_node(url: str) -> tuple[asyncio.subprocess.Process, int]:
    node = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tidings.intermediary.measurement.intermediary_process",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    plan = {
        "upstream": url,
        "world": [list(WORLD.lo), list(WORLD.hi)],
        "upstream_margin": 5.0,
        "max_connections": 10,
        "round_s": 0.01,
        "budget": 100,
    }
    assert node.stdin is not None and node.stdout is not None
    node.stdin.write(json.dumps(plan).encode() + b"\n")
    await node.stdin.drain()
    line = await asyncio.wait_for(node.stdout.readline(), WAIT)
    words = line.decode().split()
    assert len(words) == 2 and words[0] == "ready", line
    return node, int(words[1])


async def stop_node(node: asyncio.subprocess.Process) -> None:
    if node.returncode is None:
        node.kill()
        await node.wait()


async def views(client: IntermediaryClient, sim: Recorded, since: int, count: int) -> None:
    """The next ``count`` VIEW frames of ticks after ``since``: exactly the agents inside
    the region at that tick, at their positions."""
    got: list[ReceivedFrame] = []
    async for frame in client.frames():
        if frame.header.kind is not FrameKind.VIEW or frame.header.tick <= since:
            continue
        positions, tick_time = sim.history[frame.header.tick]
        np.testing.assert_array_equal(frame.ids, np.flatnonzero(inside(positions, LEFT)))
        np.testing.assert_array_equal(frame.world_positions(), positions[frame.ids])
        assert frame.header.tick_time == tick_time
        got.append(frame)
        if len(got) == count:
            return


async def subscribed(
    sim: Recorded, publisher: SimulationServer, port: int
) -> tuple[IntermediaryClient, int]:
    client = await IntermediaryClient.connect(f"ws://127.0.0.1:{port}/")
    await client.subscribe("left", LEFT, rate_hz=50)
    conn = await connection(publisher, 1)
    await until(lambda: in_union(np.array([[10.0, 10.0], [45.0, 60.0]]), conn.feed.boxes).all())
    return client, sim.tick


@server
def test_the_fanout_node_serves_a_subscriber_and_exits_0_when_stdin_closes() -> None:
    async def body(sim: Recorded, publisher: SimulationServer, url: str) -> None:
        node, port = await start_node(url)
        try:
            client, since = await subscribed(sim, publisher, port)
            await views(client, sim, since, 3)
            assert node.stdin is not None and node.stderr is not None
            node.stdin.close()
            assert await asyncio.wait_for(node.wait(), WAIT) == 0
            await client.close()
            # Its upstream connection went with it.
            await until(lambda: not publisher.connections and not sim.feeds)
        finally:
            await stop_node(node)

    serve(body)


@server
def test_the_fanout_node_exits_3_naming_the_upstream_when_the_publisher_goes_away() -> None:
    async def body(sim: Recorded, publisher: SimulationServer, url: str) -> None:
        node, port = await start_node(url)
        try:
            client, since = await subscribed(sim, publisher, port)
            await views(client, sim, since, 1)
            await publisher.aclose()
            assert await asyncio.wait_for(node.wait(), WAIT) == 3
            assert node.stderr is not None
            stderr = (await node.stderr.read()).decode()
            assert "fanout node: upstream ended: " in stderr, stderr
            await client.close()
        finally:
            await stop_node(node)

    serve(body)
