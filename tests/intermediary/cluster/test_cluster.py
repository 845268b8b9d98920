"""Many intermediaries (issue 12 item 5; claims 9, 11): responsibility by region or hash,
redirects, split and merge with handovers while subscribers receive, a view generated from
two members' states -- on real sockets, the members in one process stepped tick by tick
(so every epoch's frame can be checked against a brute-force view of that tick). Waits are
bounded only so that a broken build fails instead of hanging; nothing asserts a timing."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import waiting
from tests.support.intermediary_helpers import (
    WORLD,
    RecordedSimulation,
    assert_clean_streams,
    inside,
)
from tidings.errors import IntermediaryError
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.client.handover import ClusterClient
from tidings.intermediary.client.subscriber import ReceivedFrame
from tidings.intermediary.cluster.directory import Directory
from tidings.intermediary.cluster.in_process import Cluster
from tidings.intermediary.cluster.member import ClusterServer
from tidings.intermediary.cluster.membership import LoadPolicy
from tidings.intermediary.cluster.responsibility import HashPartition, Partition, RegionPartition
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.generation import FrameKind
from tidings.intermediary.publisher.simulation import Simulation, SimulationFeed

pytestmark = pytest.mark.sockets

WAIT = 120.0
GRID = RegionPartition(WORLD, (4, 4))
#: Regions of all kinds and places: inside one cell, across two, across four, the whole.
REGIONS: list[dict[str, Any]] = [
    {"box": {"lo": [5, 5], "hi": [20, 20]}},
    {"box": {"lo": [60, 10], "hi": [90, 20]}},
    {"sphere": {"center": [50, 50], "radius": 12}},
    {"sphere": {"center": [80, 80], "radius": 8}},
    {"box": {"lo": [30, 60], "hi": [45, 95]}},
    {"box": {"lo": [0, 0], "hi": [100, 100]}},
    {"sphere": {"center": [20, 70], "radius": 20}},
    {"box": {"lo": [70, 40], "hi": [99, 60]}},
]


class Rig:
    """A cluster on a simulation, stepped by the test; ``history[tick]`` is every agent's
    position at that tick (the brute-force reference)."""

    def __init__(self, partition: Partition, policy: LoadPolicy | None = None) -> None:
        self.sim = Simulation(400, WORLD, max_speed=5.0, seed=7)
        self.cluster = Cluster(self.sim, partition, policy=policy)
        self.history: dict[int, np.ndarray] = {}
        self.clients: list[ClusterClient] = []
        self.specs: dict[tuple[int, str], dict[str, Any]] = {}
        self.live: set[tuple[int, str]] = set()
        self.got: dict[tuple[int, str], list[ReceivedFrame]] = {}
        self._readers: list[asyncio.Task[None]] = []

    def url(self, i: int = 0) -> str:
        return list(self.cluster.members.values())[i].url

    async def subscriber(self, entry: str, key: str, spec: dict[str, Any]) -> ClusterClient:
        client = await ClusterClient.connect(entry, client_id=f"c{len(self.clients)}")
        await client.subscribe(key, spec, rate_hz=1000)
        index = len(self.clients)
        self.clients.append(client)
        self.specs[(index, key)] = spec
        self.live.add((index, key))
        self.got[(index, key)] = []

        async def read() -> None:
            async for frame in client.frames():
                self.got[(index, frame.key)].append(frame)

        self._readers.append(asyncio.create_task(read()))
        return client

    async def subscribers(self, keys: range, members: int = 1) -> list[ClusterClient]:
        """A subscriber per key ``k<i>`` of ``keys``, to the regions in turn, entering at the
        first ``members`` members in turn."""
        return [
            await self.subscriber(self.url(i % members), f"k{i}", REGIONS[i % len(REGIONS)])
            for i in keys
        ]

    async def split_first(self) -> tuple[ClusterServer, ClusterServer]:
        """Split the first member, ``i0``: it, and the new member that took part of it."""
        first = self.cluster.members["i0"]
        second = await self.cluster.split(first)
        assert second is not None
        return first, second

    async def ticks(self, count: int) -> None:
        """``count`` publisher ticks, each served to every subscription (:meth:`tick`)."""
        for _ in range(count):
            await self.tick()

    async def tick(self) -> int:
        """One publisher tick; returns once every subscription got (or holds) its frame."""
        tick = self.cluster.step()
        self.history[tick] = self.sim.positions.copy()
        await self.cluster.balance()
        for index, key in self.live:
            client = self.clients[index]
            await until(lambda c=client, k=key: c.latest(k) >= tick)
        return tick

    async def settle(self) -> None:
        """Tick until no handover is under way."""
        while any(m.handing() for m in self.cluster.members.values()) or any(
            c.moving() for c in self.clients
        ):
            await self.tick()

    async def check(self) -> int:
        """Every subscription's frames: strictly increasing epochs with none missing, each
        equal to the brute-force view of its tick. Returns the frames checked."""

        def consumed(index: int, key: str) -> bool:
            frames, last = self.got[(index, key)], self.clients[index].last_epoch(key)
            return last < 0 or (bool(frames) and frames[-1].header.epoch == last)

        await until(lambda: all(consumed(index, key) for index, key in self.live))
        checked = 0
        for ident, frames in self.got.items():
            spec = self.specs[ident]
            epochs = [f.header.epoch for f in frames]
            assert epochs == list(range(epochs[0], epochs[0] + len(epochs))), (ident, epochs)
            previous: np.ndarray | None = None
            for frame in frames:
                positions = self.history[frame.header.epoch]
                expected = np.flatnonzero(inside(positions, spec))
                if frame.header.kind is FrameKind.EMPTY:
                    assert expected.size == 0
                    previous = expected
                    continue
                if frame.header.kind is FrameKind.UNCHANGED:
                    assert previous is not None
                    np.testing.assert_array_equal(expected, previous)
                    continue
                np.testing.assert_array_equal(frame.ids, expected)
                np.testing.assert_allclose(frame.world_positions(), positions[frame.ids])
                previous = expected
            checked += len(frames)
        for client in self.clients:
            assert client.stale == 0 and client.overflowed == 0 and not client.errors
        return checked

    async def aclose(self) -> None:
        for task in self._readers:
            task.cancel()
        for client in self.clients:
            await client.close()
        await self.cluster.aclose()


#: Waits here poll often: a tick waits for every subscription's frame.
until = functools.partial(waiting.until, timeout=20.0, interval=0.002)


def run(
    body: Callable[[Rig], Awaitable[None]],
    partition: Partition = GRID,
    policy: LoadPolicy | None = None,
) -> None:
    async def main() -> None:
        rig = Rig(partition, policy)
        await rig.cluster.start()
        try:
            await asyncio.wait_for(body(rig), WAIT)
        finally:
            await rig.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("partition", [GRID, HashPartition(16)], ids=["region", "hash"])
def test_split_and_merge_while_subscribers_receive_lose_and_repeat_no_epoch(
    partition: Partition,
) -> None:
    async def body(rig: Rig) -> None:
        await rig.subscribers(range(16))
        await rig.ticks(3)
        first, second = await rig.split_first()
        await rig.ticks(4)
        third = await rig.cluster.split(first)
        assert third is not None
        # New subscribers enter at any member while handovers run; wrong ones redirect.
        await rig.subscribers(range(16, 20), members=3)
        await rig.settle()
        assert all(m.subscriptions() > 0 for m in rig.cluster.members.values())
        rig.cluster.merge(third)
        await rig.ticks(3)
        rig.cluster.merge(second)
        await rig.settle()
        await rig.ticks(3)
        assert list(rig.cluster.members) == ["i0"]
        assert first.subscriptions() == 20
        handovers = sum(c.handovers for c in rig.clients)
        assert handovers >= 10, handovers
        assert await rig.check() > 20 * 10

    run(body, partition)


def test_a_request_at_the_wrong_member_is_redirected_and_served_where_it_belongs() -> None:
    async def body(rig: Rig) -> None:
        await rig.split_first()  # i1 owns x >= 50
        client = await rig.subscriber(rig.url(0), "east", REGIONS[1])
        assert client.where("east") == rig.url(1)
        await rig.ticks(5)
        assert rig.cluster.members["i1"].subscriptions() == 1
        assert rig.cluster.members["i0"].subscriptions() == 0
        assert await rig.check() >= 5

    run(body)


def test_a_view_spanning_two_members_areas_is_generated_from_both_states() -> None:
    async def body(rig: Rig) -> None:
        west, east = await rig.split_first()
        wide = {"box": {"lo": [10, 10], "hi": [90, 60]}}  # middle (50, 35): east's cell
        client = await rig.subscriber(rig.url(0), "wide", wide)
        assert client.where("wide") == east.url
        await rig.ticks(6)
        # Each member keeps only its own area, yet the view holds agents of both.
        assert np.all(west.intermediary.state.snapshot().positions[:, 0] <= 50)
        assert np.all(east.intermediary.state.snapshot().positions[:, 0] >= 50)
        frames = rig.got[(0, "wide")]
        last = frames[-1]
        xs = last.world_positions()[:, 0]
        assert np.any(xs < 50) and np.any(xs > 50)
        assert await rig.check() >= 6

    run(body)


@pytest.mark.parametrize(
    "policy",
    [
        LoadPolicy(high=6, low=3),
        # 10 subscriptions served every 50 ms tick are 200 frames/s; 2 are 40.
        LoadPolicy(high=120, low=70, measure="frames_per_s"),
    ],
    ids=["subscriptions", "frames_per_s"],
)
def test_load_splits_an_overloaded_member_and_merges_it_back_when_load_falls(
    policy: LoadPolicy,
) -> None:
    async def body(rig: Rig) -> None:
        clients = await rig.subscribers(range(10))
        await rig.tick()
        assert rig.cluster.splits >= 1 and len(rig.cluster.members) >= 2
        await rig.settle()
        for index, client in enumerate(clients[:8]):
            await client.unsubscribe(f"k{index}")
            rig.live.discard((index, f"k{index}"))
        for _ in range(30):
            if list(rig.cluster.members) == ["i0"]:
                break
            await rig.tick()
        assert rig.cluster.merges >= 1 and list(rig.cluster.members) == ["i0"]
        assert await rig.check() > 0

    run(body, HashPartition(8), policy)


def test_bad_redirects_give_clear_errors_and_the_members_go_on() -> None:
    async def body(rig: Rig) -> None:
        await rig.split_first()
        directory = rig.cluster.directory
        # A member the directory names but that is dead: nothing listens at its URL.
        directory.join("ghost", "ws://127.0.0.1:9/")
        directory.assign([15], "ghost")
        client = await ClusterClient.connect(rig.url(0))
        with pytest.raises(IntermediaryError, match="cannot reach intermediary 'ghost'"):
            await client.subscribe("far", {"box": {"lo": [80, 80], "hi": [90, 90]}})
        # A slot nobody may own: the directory refuses; an unknown member is named.
        with pytest.raises(IntermediaryError, match="not a member"):
            directory.assign([15], "nobody")
        with pytest.raises(IntermediaryError, match="no intermediary called 'nobody'"):
            directory.member("nobody")
        with pytest.raises(IntermediaryError, match="still owns"):
            directory.leave("ghost")
        # A forward loop (a client claiming it came through the owner) is named.
        with pytest.raises(IntermediaryError, match="forward loop: i1 -> i0 -> i1"):
            await client._links[rig.url(0)].request(
                {"op": "subscribe", "key": "k", "region": REGIONS[1], "via": ["i1"]}
            )
        for bad in ({"via": "i1"}, {"via": ["x"] * 9}):
            with pytest.raises(IntermediaryError, match=r"request\.via"):
                await client._links[rig.url(0)].request(
                    {"op": "subscribe", "key": "k", "region": REGIONS[0], **bad}
                )
        with pytest.raises(IntermediaryError, match="relative to an entity"):
            await client.subscribe(
                "rel", {"sphere": {"center": [0, 0], "radius": 5}, "relative_to": 7}
            )
        with pytest.raises(IntermediaryError, match="release: no subscription"):
            await client._links[rig.url(0)].request({"op": "release", "key": "nope", "before": 3})
        # Two members whose directories disagree send a client back and forth: the second
        # one names the loop.
        loop_members = [await _standalone(rig, name) for name in ("x", "y")]
        for member, other in zip(loop_members, reversed(loop_members), strict=True):
            for each in loop_members:
                member.directory.join(each.name, each.url)
            member.directory.assign([0], other.name)
        looped = await ClusterClient.connect(loop_members[0].url)
        with pytest.raises(IntermediaryError, match="forward loop: x -> y -> x"):
            await looped.subscribe("k", REGIONS[0])
        await looped.close()
        # Responsibility by hash needs the client's id, which a plain client does not send.
        async with await IntermediaryClient.connect(loop_members[0].url) as plain:
            with pytest.raises(IntermediaryError, match=r"request\.client"):
                await plain.subscribe("k", REGIONS[0])
        for member in loop_members:
            await member.aclose()
        # The client and both members go on.
        await client.close()
        await rig.subscriber(rig.url(0), "east", REGIONS[1])
        await rig.subscriber(rig.url(1), "west", REGIONS[0])
        await rig.ticks(4)
        assert await rig.check() >= 8

    run(body)


def test_a_handover_to_a_member_running_ahead_keeps_every_epoch_in_order() -> None:
    """The members are stepped apart here (as members of one publisher are, each at its own
    pace): the new member ingests and serves a tick before the old one has served the tick
    before it. The old member must still serve that tick, and the client must deliver it
    before the new member's frames it holds."""

    async def body(rig: Rig) -> None:
        await rig.subscribers(range(8))
        await rig.ticks(3)
        old, new = await rig.split_first()
        sim, moved = rig.sim, old.handing()
        assert moved > 0
        sim.step(rig.cluster.dt)
        ahead = sim.tick
        rig.history[ahead] = sim.positions.copy()
        new.ingest()  # the new member is at the new tick, the old one not yet
        await until(lambda: old.releasing() == moved)
        old.serve()  # nothing new to serve, and the last epoch is not reached: it keeps them
        assert old.releasing() == moved
        old.ingest()
        sim.step(rig.cluster.dt)
        rig.history[sim.tick] = sim.positions.copy()
        new.ingest()
        new.serve()  # the new member's frames of the next tick arrive first, and are held
        movers = [(rig.clients[i], k) for i, k in rig.live if rig.clients[i].moving()]
        assert len(movers) == moved
        await until(lambda: all(c.latest(k) >= sim.tick for c, k in movers))
        old.serve()  # the old member's last frames, then released
        await until(lambda: all(rig.clients[i].latest(k) >= ahead for i, k in rig.live))
        old.ingest()
        old.serve()
        await until(lambda: all(rig.clients[i].latest(k) >= sim.tick for i, k in rig.live))
        await rig.settle()
        await rig.ticks(3)
        assert sum(c.handovers for c in rig.clients) == moved
        assert await rig.check() > 8 * 6

    run(body, HashPartition(16))  # no areas: a view is never composed from members apart


def test_hostile_requests_at_a_member_get_clear_errors_and_leave_nothing_behind() -> None:
    """Event and SQL subscriptions at a member without event views, a release forged for
    another subscriber's key, and a flood of release-then-unsubscribe: clear errors, the
    forged release harms nobody, and the member keeps nothing for subscriptions gone."""

    async def body(rig: Rig) -> None:
        member = rig.cluster.members["i0"]
        victim = await rig.subscriber(rig.url(0), "v", REGIONS[5])
        async with await IntermediaryClient.connect(rig.url(0)) as hostile:
            for kind in (
                {"events": [["order", "*"]]},
                {"sql": "SELECT 1"},
                {"events": [["a"]], "region": REGIONS[0]},
                {},
            ):
                with pytest.raises(IntermediaryError, match=r"regions only|exactly one of region"):
                    await hostile.request({"op": "subscribe", "key": "e", **kind})
            with pytest.raises(IntermediaryError, match="release: no subscription 'v'"):
                await hostile.request({"op": "release", "key": "v", "before": 1})
            for i in range(10):
                await hostile.subscribe(f"k{i}", REGIONS[0])
                reply = await hostile.request({"op": "release", "key": f"k{i}", "before": 10**9})
                assert reply["op"] == "releasing"
                await hostile.unsubscribe(f"k{i}")
            assert member.releasing() == 0
            await hostile.subscribe("gone", REGIONS[0])
            await hostile.request({"op": "release", "key": "gone", "before": 10**9})
        # It left with a release pending while another connection came: nothing of it stays.
        async with await IntermediaryClient.connect(rig.url(0)):
            await until(lambda: len(member.connections) == 2)  # the victim and the idle one
            await rig.tick()
            assert member.releasing() == 0
        await rig.ticks(3)
        assert await rig.check() >= 3 and victim.latest("v") == rig.sim.tick

    run(body)


def test_a_locked_or_corrupt_directory_gives_clear_errors_and_serving_goes_on(
    tmp_path: Path,
) -> None:
    """Real SQLite faults: a file that is not a database, and another connection holding the
    directory's write lock while the cluster splits (it must not leave a member behind)."""
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"garbage" * 1000)
    with pytest.raises(IntermediaryError, match=r"directory .*bad\.db: file is not a database"):
        Directory(bad)

    async def main() -> None:
        path = tmp_path / "directory.db"
        sim = Simulation(400, WORLD, max_speed=5.0, seed=7)
        cluster = Cluster(sim, HashPartition(8), directory=Directory(path, timeout_s=0.2))
        first = await cluster.start()
        client = await ClusterClient.connect(first.url, client_id="c0")
        try:
            await client.subscribe("k", REGIONS[0], rate_hz=1000)
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            other.execute("UPDATE members SET url = url")
            with pytest.raises(IntermediaryError, match=r"directory .*: database is locked"):
                await cluster.split(first)
            assert list(cluster.members) == ["i0"]
            tick = cluster.step()  # the member goes on serving from the owners it read
            await until(lambda: client.latest("k") >= tick)
            other.execute("COMMIT")
            other.close()
            assert await cluster.split(first) is not None
        finally:
            await client.close()
            await cluster.aclose()

    asyncio.run(asyncio.wait_for(main(), WAIT))


async def _standalone(rig: Rig, name: str) -> ClusterServer:
    """A member outside the rig's cluster, with a directory of its own."""
    member = ClusterServer(name, rig.sim.feed(), Directory(), HashPartition(1), dim=2, source=None)
    await member.start()
    return member


def test_a_cluster_running_on_its_own_splits_and_merges_under_load_with_clean_streams() -> None:
    """The cluster's own loop ticks in real time and balances by itself while subscribers
    read: epochs still strictly increase and every frame is its tick's brute-force view
    (frames may be dropped here, as a slow channel may drop them, so gaps are allowed)."""

    async def main() -> None:
        sim = RecordedSimulation()
        cluster = Cluster(sim, HashPartition(8), policy=LoadPolicy(high=6, low=3), tick_s=0.02)
        await cluster.start()
        cluster.start_loop()
        clients: list[ClusterClient] = []
        got: dict[str, list[ReceivedFrame]] = {}
        readers = []

        async def read(client: ClusterClient) -> None:
            async for frame in client.frames():
                got[frame.key].append(frame)

        try:
            for i in range(10):
                client = await ClusterClient.connect(cluster.members["i0"].url)
                got[f"k{i}"] = []
                await client.subscribe(f"k{i}", REGIONS[i % len(REGIONS)], rate_hz=1000)
                clients.append(client)
                readers.append(asyncio.create_task(read(client)))
            await until(lambda: cluster.splits >= 1 and not any(c.moving() for c in clients))
            counts = {key: len(frames) for key, frames in got.items()}
            await until(lambda: all(len(got[k]) > counts[k] + 10 for k in got))
            for i, client in enumerate(clients[:8]):
                await client.unsubscribe(f"k{i}")
            await until(lambda: list(cluster.members) == ["i0"])
            counts = {key: len(frames) for key, frames in got.items()}
            await until(lambda: all(len(got[k]) > counts[k] + 10 for k in ("k8", "k9")))
        finally:
            for task in readers:
                task.cancel()
            for client in clients:
                await client.close()
            await cluster.aclose()
        assert sum(c.handovers for c in clients) > 0 and cluster.merges >= 1
        assert_clean_streams(clients, got, sim, REGIONS)

    asyncio.run(asyncio.wait_for(main(), WAIT))


async def _west_and_east(
    sim: RecordedSimulation,
    source_of: Callable[[SimulationFeed, int], Callable[[], list[UpdateBatch]]],
) -> list[ClusterServer]:
    """Two members of one directory, ``west`` owning the left half of the world and ``east``
    the right, each fed by ``source_of(feed, i)`` from a feed of ``sim`` of its own."""
    partition = RegionPartition(WORLD, (2, 1))
    directory = Directory()
    members = []
    for i, name in enumerate(("west", "east")):
        feed = sim.feed()
        member = ClusterServer(name, feed, directory, partition, dim=2, source=source_of(feed, i))
        await member.start()
        directory.join(name, member.url)
        members.append(member)
    directory.assign([0], "west")
    directory.assign([1], "east")
    return members


async def _step(sim: RecordedSimulation, members: list[ClusterServer]) -> None:
    """One tick of ``sim``: every member ingests it, then every member serves."""
    sim.step(0.05)
    for member in members:
        member.ingest()
    for member in members:
        member.serve()
    await asyncio.sleep(0.01)


def test_more_pieces_at_another_member_than_one_subscriber_may_hold_are_all_served() -> None:
    """20 views, each spanning both members' areas with its own piece in the other member's
    cell: more pieces than the 16 subscriptions one subscriber may hold there. Every view
    must still get frames equal to brute force (a refused piece would stall its view)."""

    async def main() -> None:
        sim = RecordedSimulation()
        members = await _west_and_east(sim, lambda feed, _: lambda: [feed.batch()])
        specs = {
            f"v{i}": {"box": {"lo": [48, 4.6 * i], "hi": [53, 4.6 * i + 3]}} for i in range(20)
        }
        clients = [await ClusterClient.connect(members[1].url) for _ in range(2)]
        got: dict[str, list[ReceivedFrame]] = {key: [] for key in specs}

        async def read(client: ClusterClient) -> None:
            async for frame in client.frames():
                got[frame.key].append(frame)

        readers = [asyncio.create_task(read(client)) for client in clients]
        try:
            for i, (key, spec) in enumerate(specs.items()):
                reply = await clients[i % 2].subscribe(key, spec, rate_hz=1000)
                assert reply["intermediary"] == "east"
            for _ in range(200):
                if all(len(frames) >= 3 for frames in got.values()):
                    break
                await _step(sim, members)
        finally:
            for reader, client in zip(readers, clients, strict=True):
                reader.cancel()
                await client.close()
            for member in members:
                await member.aclose()
        assert all(len(frames) >= 3 for frames in got.values()), {k: len(f) for k, f in got.items()}
        for key, frames in got.items():
            for frame in frames:
                positions = sim.history[frame.header.epoch]
                expected = np.flatnonzero(inside(positions, specs[key]))
                if frame.header.kind is not FrameKind.UNCHANGED:
                    np.testing.assert_array_equal(frame.ids, expected)

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_members_that_cannot_read_each_others_state_compose_a_view_over_the_wire() -> None:
    """Two members that do not share a process in spirit (neither can read the other's
    state): the home member of a view spanning both areas subscribes to the other member
    for the pieces in its cells, and composes each epoch from its own state and those
    frames. Each member's publisher feed carries its own cells only."""

    async def main() -> None:
        sim = RecordedSimulation()
        ticked = [0, 0]

        def source_of(feed: SimulationFeed, i: int) -> Callable[[], list[UpdateBatch]]:
            def source() -> list[UpdateBatch]:
                if sim.tick == ticked[i]:
                    return []
                ticked[i] = sim.tick
                return [feed.batch()]

            return source

        members = await _west_and_east(sim, source_of)
        west, east = members
        spec = {"sphere": {"center": [55, 50], "radius": 20}}
        client = await ClusterClient.connect(west.url)
        got: list[ReceivedFrame] = []

        async def read() -> None:
            async for frame in client.frames():
                got.append(frame)

        reader = asyncio.create_task(read())
        try:
            reply = await client.subscribe("across", spec, rate_hz=1000)
            assert reply["intermediary"] == "east"
            while len(got) < 20:
                await _step(sim, members)
            assert all(box.lo[0] >= 50 for box in east.feed.boxes)  # type: ignore[attr-defined]
            assert any(box.hi[0] <= 50 for box in west.feed.boxes)  # type: ignore[attr-defined]
        finally:
            reader.cancel()
            await client.close()
            for member in members:
                await member.aclose()
        epochs = [f.header.epoch for f in got]
        assert epochs == sorted(set(epochs))
        for frame in got:
            positions = sim.history[frame.header.epoch]
            expected = np.flatnonzero(inside(positions, spec))
            assert frame.header.kind is FrameKind.VIEW
            np.testing.assert_array_equal(frame.ids, expected)
            np.testing.assert_allclose(frame.world_positions(), positions[frame.ids])
        assert np.any(got[-1].world_positions()[:, 0] < 50)

    asyncio.run(asyncio.wait_for(main(), WAIT))
