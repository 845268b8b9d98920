"""The spatial upstream over the wire (:mod:`tidings.intermediary.spatialfeed`): the batch
codec, a :class:`SimulationServer` on a real socket feeding :class:`RemoteFeed` upstreams
(and an :class:`Intermediary` built on one), hostile and slow intermediaries at the
publisher, and ``python -m tidings.intermediary.fanout_node`` as a real process.

Batches are checked against a brute-force reference: the simulation keeps every tick's
positions, so a batch of tick ``t`` must hold exactly the agents whose positions at ``t`` lie
in the union of the subscribed boxes (or are followed). A batch is only checked once the
publisher has applied the subscription it depends on (its tick is past the tick seen then).
No test asserts timings: waits are bounded only so that a broken build fails instead of
hanging."""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import struct
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

import numpy as np
import pytest
import websockets
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.intermediary_helpers import WORLD, inside
from tests.support.waiting import run, until
from tidings.errors import IntermediaryError
from tidings.intermediary.client import IntermediaryClient, ReceivedFrame
from tidings.intermediary.coverage import UpstreamPolicy
from tidings.intermediary.generation import FrameKind, decode_frame
from tidings.intermediary.geometry import Box
from tidings.intermediary.process import Intermediary
from tidings.intermediary.scheduling import Scheduler
from tidings.intermediary.simulation import Simulation, SimulationFeed
from tidings.intermediary.spatialfeed import (
    HEADER,
    MAGIC,
    POLICY_CLOSE_CODE,
    VERSION,
    FeedConnection,
    RemoteFeed,
    SimulationServer,
    decode_batch,
    encode_batch,
)
from tidings.intermediary.state import UpdateBatch

server = pytest.mark.sockets

TICK_HZ = 20.0
WAIT = 30.0
LEFT = {"box": {"lo": [10, 10], "hi": [45, 60]}}
RIGHT = {"box": {"lo": [60, 20], "hi": [95, 90]}}


# -- the batch codec -----------------------------------------------------------------------


def batch_of(dim: int, ids: Sequence[int], deleted: Sequence[int], seed: int = 0) -> UpdateBatch:
    rng = np.random.default_rng(seed)
    return UpdateBatch(
        ids=np.array(ids, dtype=np.int64),
        positions=rng.uniform(-1e6, 1e6, size=(len(ids), dim)),
        delete=np.array(deleted, dtype=np.int64),
        tick=41,
        tick_time=1_700_000_000.25,
    )


def assert_same_batch(got: UpdateBatch, sent: UpdateBatch, dim: int) -> None:
    ids = np.asarray(sent.ids, dtype=np.int64)
    assert got.ids.dtype == np.int64 and got.delete.dtype == np.int64
    assert got.positions is not None and got.positions.dtype == np.float64
    assert got.positions.shape == (len(ids), dim)
    np.testing.assert_array_equal(got.ids, ids)
    if sent.positions is not None:
        np.testing.assert_array_equal(got.positions, np.asarray(sent.positions))
    np.testing.assert_array_equal(got.delete, np.asarray(sent.delete, dtype=np.int64))
    assert got.tick == (0 if sent.tick is None else sent.tick)
    assert got.tick_time == sent.tick_time


int64s = st.integers(-(2**63), 2**63 - 1)
coordinates = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    dim=st.sampled_from([2, 3]),
    ids=st.lists(int64s, max_size=40, unique=True),
    deleted=st.lists(int64s, max_size=20, unique=True),
    tick=st.integers(0, 2**64 - 1),
    tick_time=st.floats(allow_nan=False, allow_infinity=False),
)
def test_a_batch_survives_encoding_and_decoding(
    data: st.DataObject,
    dim: int,
    ids: list[int],
    deleted: list[int],
    tick: int,
    tick_time: float,
) -> None:
    positions = data.draw(
        st.lists(
            st.lists(coordinates, min_size=dim, max_size=dim),
            min_size=len(ids),
            max_size=len(ids),
        )
    )
    sent = UpdateBatch(
        ids=np.array(ids, dtype=np.int64),
        positions=np.array(positions, dtype=np.float64).reshape(len(ids), dim),
        delete=np.array(deleted, dtype=np.int64),
        tick=tick,
        tick_time=tick_time,
    )
    message = encode_batch(sent, dim, applied=tick // 2)
    assert len(message) == HEADER.size + 8 * (len(ids) * (1 + dim) + len(deleted))
    got, applied = decode_batch(message, dim)
    assert_same_batch(got, sent, dim)
    assert applied == tick // 2


def test_the_wire_layout_is_the_documented_header_then_ids_positions_and_deletions() -> None:
    sent = batch_of(3, [7, -2, 2**62], [5, 9], seed=1)
    message = encode_batch(sent, 3, applied=6)
    # The documented format: 4 + 1 + 1 + 2 + 8 + 8 + 8 + 4 + 4 bytes.
    assert HEADER.size == struct.calcsize("<4sBBHQQdII") == 40
    fields = struct.unpack_from("<4sBBHQQdII", message)
    assert (MAGIC, VERSION) == (b"TSFB", 1)
    assert fields == (b"TSFB", 1, 3, 0, 41, 6, 1_700_000_000.25, 3, 2)
    body = message[40:]
    assert struct.unpack_from("<3q", body) == (7, -2, 2**62)
    positions = struct.unpack_from("<9d", body, 24)
    assert positions == tuple(np.asarray(sent.positions).ravel().tolist())
    assert struct.unpack_from("<2q", body, 24 + 72) == (5, 9)
    assert len(body) == 24 + 72 + 16


@pytest.mark.parametrize("dim", [2, 3])
def test_an_empty_batch_and_a_deletions_only_batch_round_trip(dim: int) -> None:
    empty = UpdateBatch(tick=None, tick_time=0.0)
    message = encode_batch(empty, dim)
    assert len(message) == HEADER.size
    got, applied = decode_batch(message, dim)
    assert_same_batch(got, empty, dim)
    assert got.tick == 0 and len(got.ids) == 0 and len(got.delete) == 0 and applied == 0

    deletions = UpdateBatch(delete=np.array([3, 1, 2]), tick=9, tick_time=12.5)
    got, _ = decode_batch(encode_batch(deletions, dim), dim)
    assert_same_batch(got, deletions, dim)


def test_a_batch_whose_positions_do_not_match_its_ids_is_not_encoded() -> None:
    bad = UpdateBatch(ids=np.array([1, 2]), positions=np.zeros((2, 3)), tick=1)
    with pytest.raises(IntermediaryError, match=r"2 ids need positions of shape \(2, 2\)"):
        encode_batch(bad, 2)
    with pytest.raises(IntermediaryError, match=r"tick time must be finite"):
        encode_batch(UpdateBatch(tick=1, tick_time=math.inf), 2)
    with pytest.raises(IntermediaryError, match=r"tick must be in \[0, 2\*\*64\), not -1"):
        encode_batch(UpdateBatch(tick=-1), 2)
    with pytest.raises(IntermediaryError, match=r"applied must be in"):
        encode_batch(UpdateBatch(tick=1), 2, applied=2**64)


def good_message(dim: int = 2) -> bytes:
    return encode_batch(batch_of(dim, [1, 2, 3], [4]), dim)


def with_header(message: bytes, **fields: Any) -> bytes:
    names = ("magic", "version", "dim", "reserved", "tick", "applied", "tick_time", "n", "m")
    values = dict(zip(names, HEADER.unpack_from(message), strict=True))
    values.update(fields)
    return HEADER.pack(*(values[name] for name in names)) + message[HEADER.size :]


@pytest.mark.parametrize(
    ("message", "dim", "problem"),
    [
        (b"", 2, r"a batch of 0 bytes is shorter than its header"),
        (good_message()[: HEADER.size - 1], 2, r"39 bytes is shorter than its header"),
        (with_header(good_message(), magic=b"XSFB"), 2, r"not a version 1 batch \(b'XSFB' v1\)"),
        (with_header(good_message(), version=2), 2, r"not a version 1 batch \(b'TSFB' v2\)"),
        (good_message(2), 3, r"a 2D batch for a 3D intermediary"),
        (good_message(3), 2, r"a 3D batch for a 2D intermediary"),
        (good_message() + b"\0" * 8, 2, r"3 upserts and 1 deletions cannot be 128 bytes"),
        (good_message()[:-8], 2, r"3 upserts and 1 deletions cannot be 112 bytes"),
        (with_header(good_message(), n=4), 2, r"4 upserts and 1 deletions cannot be 120 bytes"),
        (with_header(good_message(), tick_time=math.nan), 2, r"tick time must be finite"),
        (with_header(good_message(), tick_time=-math.inf), 2, r"tick time must be finite"),
    ],
    ids=[
        "empty",
        "short",
        "magic",
        "version",
        "2D-for-3D",
        "3D-for-2D",
        "long",
        "truncated",
        "counts",
        "nan-time",
        "inf-time",
    ],
)
def test_a_malformed_batch_is_refused_naming_the_problem(
    message: bytes, dim: int, problem: str
) -> None:
    assert len(good_message()) == 120  # 40 + 8 * (3 + 3 * 2 + 1)
    with pytest.raises(IntermediaryError, match=problem):
        decode_batch(message, dim)


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
        feed = await RemoteFeed.connect(url, 2)
        node = Intermediary(2, feed, world=WORLD)
        checker = Checker(sim, feed, node)
        conn = await connection(publisher, 1)
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
        feed = await RemoteFeed.connect(url, 2)
        node = Intermediary(2, feed, world=WORLD)
        checker = Checker(sim, feed, node)
        conn = await connection(publisher, 1)
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
        feed = await RemoteFeed.connect(url, 2)
        checker = Checker(sim, feed)
        conn = await connection(publisher, 1)
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
        good = await RemoteFeed.connect(url, 2)
        checker = Checker(sim, good)
        good_conn = await connection(publisher, 1)
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
        feed = await RemoteFeed.connect(url, 2)
        checker = Checker(sim, feed)
        conn = await connection(publisher, 1)
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


# -- the fan-out node as a real process ----------------------------------------------------


async def start_node(url: str) -> tuple[asyncio.subprocess.Process, int]:
    node = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tidings.intermediary.fanout_node",
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
