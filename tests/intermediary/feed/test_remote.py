"""The spatial upstream over the wire (:mod:`tidings.intermediary.feed.remote`): a
:class:`SimulationServer` on a real socket feeding :class:`RemoteFeed` upstreams
(and an :class:`Intermediary` built on one), hostile and slow intermediaries at the
publisher (the measurement's intermediary process is tested in
``tests/intermediary/measurement``).

Batches are checked against a brute-force reference: the simulation keeps every tick's
positions, so a batch of tick ``t`` must hold exactly the agents whose positions at ``t`` lie
in the union of the subscribed boxes (or are followed). A batch is only checked once the
publisher has applied the subscription it depends on (its tick is past the tick seen then).
No test asserts timings: waits are bounded only so that a broken build fails instead of
hanging."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import numpy as np
import pytest
import websockets

from tests.support.intermediary_helpers import WORLD, inside
from tests.support.waiting import run, until
from tidings.errors import IntermediaryError
from tidings.intermediary.feed.remote import RemoteFeed
from tidings.intermediary.feed.wire import (
    POLICY_CLOSE_CODE,
)
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.generation import FrameKind, decode_frame
from tidings.intermediary.node.intermediary import Intermediary
from tidings.intermediary.node.scheduling import Scheduler
from tidings.intermediary.publisher.server import FeedConnection, SimulationServer
from tidings.intermediary.publisher.simulation import Simulation, SimulationFeed
from tidings.intermediary.regions.coverage import UpstreamPolicy
from tidings.intermediary.regions.geometry import Box

server = pytest.mark.sockets

TICK_HZ = 20.0
WAIT = 30.0
LEFT = {"box": {"lo": [10, 10], "hi": [45, 60]}}
RIGHT = {"box": {"lo": [60, 20], "hi": [95, 90]}}


# -- a publisher on a real socket ----------------------------------------------------------


class Recorded(Simulation):
    """A simulation that keeps every tick's positions and time: the reference a batch of
    that tick is checked against, whatever the simulation did since."""

    def __init__(self, n: int, world: Box = WORLD, **options: Any) -> None:
        super().__init__(n, world, max_speed=5.0, **options)
        self.history: dict[int, tuple[np.ndarray, float]] = {}

    def step(self, dt: float) -> None:
        super().step(dt)
        self.history[self.tick] = (self.positions.copy(), self.tick_time)


def in_union(positions: np.ndarray, boxes: Collection[Box]) -> np.ndarray:
    """Which points lie in at least one box, by plain comparisons."""
    mask = np.zeros(len(positions), dtype=bool)
    for box in boxes:
        mask |= np.all((positions >= np.array(box.lo)) & (positions <= np.array(box.hi)), axis=1)
    return mask


def spec_box(spec: dict[str, Any]) -> Box:
    return Box(tuple(spec["box"]["lo"]), tuple(spec["box"]["hi"]))


class Checker:
    """Takes a :class:`RemoteFeed`'s batches and checks each against the simulation's
    history; with ``node``, feeds them to an intermediary as the intermediary server does
    (apply each, end the epoch at the latest tick) and checks its state is the last batch."""

    def __init__(self, sim: Recorded, feed: RemoteFeed, node: Intermediary | None = None):
        self.sim = sim
        self.feed = feed
        self.node = node
        self.sent = np.empty(0, dtype=np.int64)
        self.batches: list[UpdateBatch] = []

    @property
    def intermediary(self) -> Intermediary:
        """The intermediary it feeds (given as ``node``)."""
        assert self.node is not None
        return self.node

    def ingest(self) -> list[UpdateBatch]:
        batches = self.feed.take()
        for batch in batches:
            # Each batch is the whole relevant set; its deletions are what left it since the
            # batch before (so none may be missed or dropped).
            assert batch.positions is not None
            np.testing.assert_array_equal(batch.delete, np.setdiff1d(self.sent, batch.ids))
            self.sent = np.asarray(batch.ids)
            positions, tick_time = self.sim.history[batch.tick]  # type: ignore[index]
            np.testing.assert_array_equal(batch.positions, positions[batch.ids])
            assert batch.tick_time == tick_time
        self.batches += batches
        if batches and self.node is not None:
            for batch in batches:
                self.node.apply(batch)
            last = batches[-1]
            assert self.node.end_epoch(max(b.tick for b in batches if b.tick is not None)) == (
                last.tick
            )
            snapshot = self.node.state.snapshot()
            np.testing.assert_array_equal(snapshot.ids, last.ids)
            np.testing.assert_array_equal(snapshot.positions, last.positions)  # type: ignore[arg-type]
            assert (snapshot.tick, snapshot.tick_time) == (last.tick, last.tick_time)
        return batches

    async def verify(
        self,
        boxes: Collection[Box],
        followed: Collection[int] = (),
        *,
        since: int,
        count: int = 5,
    ) -> list[UpdateBatch]:
        """The next ``count`` batches of ticks after ``since``, each exactly the agents in
        ``boxes`` or ``followed`` at its tick."""
        checked: list[UpdateBatch] = []
        while len(checked) < count:
            await asyncio.sleep(0.01)
            for batch in self.ingest():
                assert batch.tick is not None
                if batch.tick <= since:
                    continue
                positions, _ = self.sim.history[batch.tick]
                expected = np.flatnonzero(
                    in_union(positions, boxes) | np.isin(self.sim.ids, list(followed))
                )
                np.testing.assert_array_equal(batch.ids, expected)
                checked.append(batch)
        return checked

    async def newer_than(self, tick: int) -> None:
        """Until a batch of a tick after ``tick`` arrived."""
        while not self.batches or self.batches[-1].tick <= tick:  # type: ignore[operator]
            await asyncio.sleep(0.01)
            self.ingest()


async def serving(
    body: Callable[[Recorded, SimulationServer, str], Awaitable[None]], n: int = 300
) -> None:
    sim = Recorded(n, seed=5)
    publisher = SimulationServer(sim, tick_hz=TICK_HZ)
    url = await publisher.start()
    try:
        await body(sim, publisher, url)
    finally:
        await publisher.aclose()


def serve(body: Callable[[Recorded, SimulationServer, str], Awaitable[None]]) -> None:
    run(serving(body), WAIT)


async def connection(publisher: SimulationServer, count: int) -> FeedConnection:
    """The newest of ``count`` connections, once the publisher holds them."""
    await until(lambda: len(publisher.connections) == count)
    return publisher.connections[-1]


async def connected(
    sim: Recorded, publisher: SimulationServer, url: str, *, fed: bool = False
) -> tuple[Checker, FeedConnection]:
    """A :class:`RemoteFeed` to the publisher at ``url`` with its :class:`Checker` (feeding
    an intermediary of its own if ``fed``), and the publisher's side of the connection."""
    feed = await RemoteFeed.connect(url, 2)
    checker = Checker(sim, feed, Intermediary(2, feed, world=WORLD) if fed else None)
    return checker, await connection(publisher, 1)


async def applied(
    conn: FeedConnection, boxes: Collection[Box], followed: Collection[int] = ()
) -> int:
    """Until the publisher's feed holds exactly ``boxes`` (a multiset) and ``followed``; the
    simulation's tick then: every later batch is computed from them."""
    feed: SimulationFeed = conn.feed
    await until(
        lambda: Counter(feed.boxes) == Counter(boxes) and feed.followed == frozenset(followed)
    )
    return feed.simulation.tick


@server
def test_an_intermediary_fed_over_the_wire_holds_exactly_what_its_upstream_boxes_cover() -> None:
    async def body(sim: Recorded, publisher: SimulationServer, url: str) -> None:
        checker, conn = await connected(sim, publisher, url, fed=True)
        feed, node = checker.feed, checker.intermediary
        node.subscribe("s", "left", LEFT)
        upstream = node.subscriptions.boxes
        assert upstream, "the intermediary asked for nothing upstream"
        since = await applied(conn, upstream)
        batches = await checker.verify(upstream, since=since)
        for batch in batches:
            positions, _ = sim.history[batch.tick]  # type: ignore[index]
            # The subscriber's region is covered: all its agents are in the state.
            wanted = np.flatnonzero(inside(positions, LEFT))
            assert len(wanted) > 0
            assert np.isin(wanted, batch.ids).all()
        assert len(sim.feeds) == 1 and feed.closed_reason is None
        assert feed.bytes_received > 0
        await feed.aclose()
        assert feed.closed_reason == "closed by the intermediary"
        await until(lambda: not publisher.connections and not sim.feeds)

    serve(body)


@server
def test_unsubscribing_shrinks_what_arrives_and_deletes_what_left() -> None:
    async def body(sim: Recorded, publisher: SimulationServer, url: str) -> None:
        checker, conn = await connected(sim, publisher, url, fed=True)
        feed, node = checker.feed, checker.intermediary
        node.subscribe("s", "left", LEFT)
        node.subscribe("s", "right", RIGHT)
        both = node.subscriptions.boxes
        since = await applied(conn, both)
        right_box = spec_box(RIGHT)
        before = await checker.verify(both, since=since)
        positions, _ = sim.history[before[-1].tick]  # type: ignore[index]
        assert in_union(positions[before[-1].ids], [right_box]).any()

        assert node.unsubscribe("s", "right") == 1
        # Upstream shrinks at the next epoch end.
        await until(lambda: bool(checker.ingest()) and node.subscriptions.boxes != both)
        left_only = node.subscriptions.boxes
        assert not in_union(np.array([right_box.lo, right_box.hi]), left_only).any()
        since = await applied(conn, left_only)
        after = await checker.verify(left_only, since=since)
        for batch in after:
            positions, _ = sim.history[batch.tick]  # type: ignore[index]
            assert not in_union(positions[batch.ids], [right_box]).any()
        snapshot = node.state.snapshot()
        assert not in_union(snapshot.positions, [right_box]).any()
        assert len(snapshot) > 0
        await feed.aclose()

    serve(body)


@server
def test_followed_agents_arrive_wherever_they_are_until_no_longer_followed() -> None:
    async def body(sim: Recorded, publisher: SimulationServer, url: str) -> None:
        checker, conn = await connected(sim, publisher, url)
        feed = checker.feed
        corner = Box((0.0, 0.0), (25.0, 25.0))
        feed.subscribe([corner])
        since = await applied(conn, [corner])
        recent = await checker.verify([corner], since=since, count=2)
        positions, _ = sim.history[recent[-1].tick]  # type: ignore[index]
        outside = np.flatnonzero(~in_union(positions, [Box((-5.0, -5.0), (40.0, 40.0))]))
        followed = [int(outside[0]), int(outside[len(outside) // 2]), int(outside[-1])]

        feed.follow(frozenset(followed))
        since = await applied(conn, [corner], followed)
        for batch in await checker.verify([corner], followed, since=since):
            assert np.isin(followed, batch.ids).all()

        feed.follow(frozenset())
        since = await applied(conn, [corner])
        await checker.verify([corner], since=since)
        held = set(checker.batches[-1].ids.tolist())  # type: ignore[union-attr]
        positions, _ = sim.history[checker.batches[-1].tick]  # type: ignore[index]
        assert held == set(np.flatnonzero(in_union(positions, [corner])).tolist())
        await feed.aclose()

    serve(body)


# -- hostile intermediaries at the publisher -----------------------------------------------


@server
@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ("{not json", r"a control message must be JSON"),
        (b'{"op": "subscribe", "boxes": []}', r"sends text \(JSON\) messages only"),
        ('["subscribe"]', r"must be a JSON object"),
        ('{"op": "teleport"}', r"unknown op 'teleport'"),
        (json.dumps({"op": "\u00e9" * 100}, ensure_ascii=False), r"unknown op '\u00e9+"),
        (
            '{"op": "subscribe", "boxes": [{"lo": [0, 0, 0], "hi": [1, 1, 1]}]}',
            r"expected 2D boxes, got 3D",
        ),
        ('{"op": "subscribe", "boxes": {"lo": [0, 0]}}', r"subscribe: 'boxes' must be a list"),
        (
            '{"op": "unsubscribe", "boxes": [{"lo": [1, 2], "hi": [3, 4]}]}',
            r"Box\(.*\) is not subscribed",
        ),
        ('{"op": "follow", "entities": [1, "7"]}', r"entities must be int64 ids"),
        ('{"op": "follow", "entities": [1.5]}', r"entities must be int64 ids"),
    ],
    ids=[
        "not-json",
        "binary",
        "not-object",
        "unknown-op",
        "non-ascii-op",
        "wrong-dim",
        "boxes-not-list",
        "not-subscribed",
        "follow-str",
        "follow-float",
    ],
)
def test_a_refused_message_closes_only_that_connection_with_1008_naming_the_problem(
    message: str | bytes, problem: str
) -> None:
    async def body(sim: Recorded, publisher: SimulationServer, url: str) -> None:
        checker, good_conn = await connected(sim, publisher, url)
        good = checker.feed
        good.subscribe([Box((0.0, 0.0), (50.0, 50.0))])
        await checker.newer_than(0)
        async with websockets.connect(url, max_size=None) as hostile:
            await connection(publisher, 2)
            await hostile.send(message)
            with pytest.raises(websockets.ConnectionClosedError) as closed:
                async for _ in hostile:
                    pass
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == POLICY_CLOSE_CODE
        assert closed.value.rcvd.reason.startswith("feed: ") or closed.value.rcvd.reason.startswith(
            "simulation: "
        )
        assert closed.value.rcvd.reason == closed.value.rcvd.reason[:120]
        assert re.search(problem, closed.value.rcvd.reason), closed.value.rcvd.reason
        tick = sim.tick
        # The hostile connection's feed is gone; the well-behaved one goes on.
        await until(lambda: publisher.connections == [good_conn] and sim.feeds == [good_conn.feed])
        await checker.newer_than(tick)
        assert good.closed_reason is None
        await good.aclose()

    serve(body)


# -- the intermediary side's checks and the upstream going away ----------------------------


@server
def test_a_remote_feed_refuses_bad_operations_at_the_call_and_after_the_publisher_left() -> None:
    async def body(sim: Recorded, publisher: SimulationServer, url: str) -> None:
        checker, conn = await connected(sim, publisher, url)
        feed = checker.feed
        box = Box((10.0, 10.0), (30.0, 30.0))
        with pytest.raises(IntermediaryError, match=r"expected 2D boxes"):
            feed.subscribe([Box((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))])
        with pytest.raises(IntermediaryError, match=r"is not subscribed"):
            feed.unsubscribe([box])
        with pytest.raises(IntermediaryError, match=r"follow expects int64 entity ids"):
            feed.follow(frozenset({1.5}))  # type: ignore[arg-type]
        with pytest.raises(IntermediaryError, match=r"follow expects int64 entity ids"):
            feed.follow(frozenset({2**63}))
        # Twice the same box, once removed: the publisher holds one (a multiset), and none
        # of the refused operations above reached it (it would have closed the connection).
        feed.subscribe([box, box])
        feed.unsubscribe([box])
        with pytest.raises(IntermediaryError, match=r"more than 4096 boxes on one feed"):
            feed.subscribe([box] * 4096)
        since = await applied(conn, [box])
        await checker.verify([box], since=since, count=2)
        assert feed.closed_reason is None

        await publisher.aclose()
        await asyncio.wait_for(feed.closed.wait(), WAIT)
        assert feed.closed_reason is not None
        for operation in (
            lambda: feed.subscribe([Box((0.0, 0.0), (1.0, 1.0))]),
            lambda: feed.unsubscribe([box]),
            lambda: feed.follow(frozenset({1})),
        ):
            with pytest.raises(IntermediaryError, match=r"the upstream connection is closed: "):
                operation()
        await feed.aclose()

    serve(body)


@server
def test_a_remote_feed_names_the_publisher_closing_it() -> None:
    async def body(sim: Recorded, publisher: SimulationServer, url: str) -> None:
        feed = await RemoteFeed.connect(url, 2)
        await connection(publisher, 1)
        await publisher.aclose()
        await asyncio.wait_for(feed.closed.wait(), WAIT)
        # The publisher closes with 1001 (going away) when it shuts down.
        assert feed.closed_reason == "closed by the publisher: 1001"
        await feed.aclose()

    serve(body)


@server
def test_connecting_to_no_publisher_is_an_error_naming_the_url() -> None:
    async def main() -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"ws://127.0.0.1:{port}/"
        with pytest.raises(IntermediaryError, match=rf"cannot connect to {url}"):
            await RemoteFeed.connect(url, 2, open_timeout=5.0)

    run(main(), WAIT)


# -- a slow intermediary -------------------------------------------------------------------


@server
def test_a_slow_intermediary_is_skipped_without_holding_back_the_others() -> None:
    async def main() -> None:
        sim = Simulation(20_000, WORLD, max_speed=5.0, seed=7)
        publisher = SimulationServer(sim, tick_hz=TICK_HZ)
        url = await publisher.start()
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.connect(("127.0.0.1", publisher.port))
        # A client that never reads: at most one frame queued, then its socket fills.
        slow = await websockets.connect(
            url, sock=raw, max_size=None, max_queue=1, compression=None, ping_interval=None
        )
        try:
            slow_conn = await connection(publisher, 1)
            transport = slow_conn.websocket.transport
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            await slow.send(json.dumps({"op": "subscribe", "boxes": [dict_of(WORLD)]}))
            good = await RemoteFeed.connect(url, 2)
            await connection(publisher, 2)
            good.subscribe([Box((40.0, 40.0), (45.0, 45.0))])
            # Stalled: three ticks in a row skipped since its last batch was computed.
            last = [slow_conn.feed.batches, slow_conn.skipped]

            def stalled() -> bool:
                if slow_conn.feed.batches != last[0]:
                    last[:] = [slow_conn.feed.batches, slow_conn.skipped]
                return slow_conn.skipped >= last[1] + 3

            await until(stalled)
            computed, skipped, tick = slow_conn.feed.batches, slow_conn.skipped, sim.tick
            got: list[UpdateBatch] = []

            def moved_on() -> bool:
                got.extend(good.take())
                return slow_conn.skipped >= skipped + 5 and any(
                    b.tick is not None and b.tick > tick + 5 for b in got
                )

            await until(moved_on)
            # Skipped ticks are not computed for it (nothing queues at the publisher), while
            # the reading intermediary got its batches.
            assert slow_conn.feed.batches == computed
            assert not slow_conn.ready
            assert good.closed_reason is None
            assert all(len(b.ids) < 1000 for b in got)
            await good.aclose()
        finally:
            # No closing handshake: its close frame would wait behind the unread batch.
            slow.transport.abort()
            raw.close()
            await publisher.aclose()

    run(main(), WAIT)


def dict_of(box: Box) -> dict[str, list[float]]:
    return {"lo": list(box.lo), "hi": list(box.hi)}


# -- never a view from state upstream has not filled yet --------------------------------


@server
@pytest.mark.parametrize("policy", ["exact", "margin"])
def test_no_view_is_served_before_upstream_sends_its_part_of_the_world(policy: str) -> None:
    """Over the wire a request reaches the publisher a tick or more later. Two subscribers
    asking for the same new place one after the other (the second covered by the first's
    request, not yet applied), and a view following a moving agent (re-covered ahead of
    it, or waiting when it moved past): every frame served equals that tick's brute force,
    and frames keep coming."""

    async def body(sim: Recorded, publisher: SimulationServer, url: str) -> None:
        feed = await RemoteFeed.connect(url, 2)
        chosen = UpstreamPolicy.margin(6.0) if policy == "margin" else UpstreamPolicy.exact()
        node = Intermediary(2, feed, world=WORLD, policy=chosen, scheduler=Scheduler())
        follower = int(np.argmin(np.abs(sim.positions - 50.0).sum(axis=1)))
        specs = {
            ("a", "place"): {"box": {"lo": [10, 10], "hi": [30, 30]}},
            ("b", "place"): {"box": {"lo": [12, 12], "hi": [28, 28]}},
            ("c", "near"): {"sphere": {"center": [0, 0], "radius": 8}, "relative_to": follower},
        }
        checked: Counter[tuple[str, str]] = Counter()
        now = 0.0
        try:
            while not feed.take():  # the feed is live
                await asyncio.sleep(0.01)
            for (subscriber, key), spec in specs.items():
                node.subscribe(subscriber, key, spec, rate_hz=1000)
            while min(checked[k] for k in specs) < 10:
                await asyncio.sleep(0.01)
                batches = feed.take()
                if not batches:
                    continue
                for batch in batches:
                    node.apply(batch)
                epoch = node.end_epoch(max(b.tick for b in batches if b.tick is not None))
                positions, _ = sim.history[epoch]
                now += 1.0
                for served in node.round(now, budget=10):
                    header, ids, _ = decode_frame(served.frame.data)
                    assert header.epoch == epoch
                    if served.frame.kind is FrameKind.UNCHANGED:
                        continue
                    spec = specs[(served.subscriber, served.key)]  # type: ignore[index]
                    expected = np.flatnonzero(inside(positions, spec))
                    np.testing.assert_array_equal(ids, expected)
                    checked[(served.subscriber, served.key)] += 1  # type: ignore[index]
        finally:
            await feed.aclose()

    serve(body)
