"""A cluster of intermediaries in separate OS processes (issue 12 item 5): under load the
supervisor starts a new member *process* and moves half the slots to it, subscribers follow
their handovers, and when the load falls the member gives everything back and its process
ends. Real processes, real sockets, a real directory file; the publisher is a simulation
served over the wire, and every frame is checked against its tick's brute force."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

from tests.support import waiting
from tests.support.intermediary_helpers import RecordedSimulation, assert_clean_streams
from tidings.errors import IntermediaryError
from tidings.intermediary.client.handover import ClusterClient
from tidings.intermediary.client.subscriber import ReceivedFrame
from tidings.intermediary.cluster import children
from tidings.intermediary.cluster.directory import Directory, Load
from tidings.intermediary.cluster.membership import LoadPolicy
from tidings.intermediary.cluster.process_cluster import ProcessCluster
from tidings.intermediary.cluster.responsibility import HashPartition, RegionPartition
from tidings.intermediary.publisher.server import SimulationServer

WAIT = 120.0
REGIONS = [
    {"box": {"lo": [5, 5], "hi": [30, 30]}},
    {"sphere": {"center": [50, 50], "radius": 15}},
    {"box": {"lo": [60, 10], "hi": [90, 40]}},
]

pytestmark = pytest.mark.slow


#: Members are processes that start, split and merge: waits here may take a minute.
until = functools.partial(waiting.until, timeout=60.0, interval=0.02)


class Rig:
    """A simulation served over the wire, a process cluster balancing on its own, and ten
    subscribers entering at its first member, their frames collected by key."""

    def __init__(self, directory: Path, policy: LoadPolicy) -> None:
        self.sim = RecordedSimulation()
        self.publisher = SimulationServer(self.sim, tick_hz=20)
        self.directory = directory
        self.policy = policy
        self.clients: list[ClusterClient] = []
        self.got: dict[str, list[ReceivedFrame]] = {}
        self._readers: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> ProcessCluster:
        upstream = await self.publisher.start()
        self.cluster = ProcessCluster(
            upstream, HashPartition(8), self.directory, dim=2, policy=self.policy, interval_s=0.2
        )
        first = await self.cluster.start()
        self.cluster.start_loop()
        for i in range(10):
            client = await ClusterClient.connect(first.url)
            self.got[f"k{i}"] = []
            await client.subscribe(f"k{i}", REGIONS[i % len(REGIONS)], rate_hz=1000)
            self.clients.append(client)
            self._readers.append(asyncio.create_task(self._read(client)))
        return self.cluster

    async def _read(self, client: ClusterClient) -> None:
        async for frame in client.frames():
            self.got[frame.key].append(frame)

    async def __aexit__(self, *exc: object) -> None:
        for task in self._readers:
            task.cancel()
        for client in self.clients:
            await client.close()
        await self.cluster.aclose()
        await self.publisher.aclose()

    def moving(self) -> bool:
        return any(client.moving() for client in self.clients)

    async def more_frames(self, keys: list[str] | None = None) -> None:
        """Until every key (or each of ``keys``) got ten more frames."""
        keys = list(self.got) if keys is None else keys
        counts = {key: len(self.got[key]) for key in keys}
        await until(lambda: all(len(self.got[k]) > counts[k] + 10 for k in keys), timeout=90)


def test_a_split_starts_a_member_process_and_a_merge_ends_it_with_clean_streams(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "directory.db", LoadPolicy(high=6, low=3))

    async def main() -> None:
        async with rig as cluster:
            await until(lambda: cluster.splits >= 1 and not rig.moving())
            pids = {member.process.pid for member in cluster.members.values()}
            assert len(pids) == len(cluster.members) >= 2  # each member its own process
            await rig.more_frames()
            started = [m.process for name, m in cluster.members.items() if name != "p0"]
            for i, client in enumerate(rig.clients[:8]):
                await client.unsubscribe(f"k{i}")
            await until(lambda: list(cluster.members) == ["p0"])
            for process in started:  # the merged members' processes ended
                await asyncio.wait_for(process.wait(), 10)
            await rig.more_frames(["k8", "k9"])
            assert cluster.merges >= 1
            assert set(Directory(rig.directory).owners().values()) == {"p0"}

    asyncio.run(asyncio.wait_for(main(), WAIT))
    assert sum(c.handovers for c in rig.clients) > 0
    assert_clean_streams(rig.clients, rig.got, rig.sim, REGIONS)


def test_a_member_killed_is_buried_and_its_subscribers_are_served_again(tmp_path: Path) -> None:
    """SIGKILL a member started by a split: the supervisor gives its slots back to the member
    it split from, and every subscriber it served subscribes again through its entry and gets
    frames again (every key, ten more); no epoch repeats or goes back, every frame is its
    tick's brute force."""
    # At most two members, never merges.
    rig = Rig(tmp_path / "directory.db", LoadPolicy(high=6, low=0, max_members=2))

    async def main() -> None:
        async with rig as cluster:
            await until(lambda: cluster.splits == 1 and not rig.moving())
            assert set(Directory(rig.directory).owners().values()) == {"p0", "p1"}
            cluster.members["p1"].process.kill()
            await until(lambda: "p1" not in cluster.members)
            # (p0, overloaded again, may split again meanwhile: p1 is gone either way.)
            assert "p1" not in Directory(rig.directory).owners().values()
            await rig.more_frames()
            await until(lambda: not rig.moving())

    asyncio.run(asyncio.wait_for(main(), WAIT))
    # A handover the old member offered toward the dead one may have failed (it keeps
    # serving the key, and the client says why in errors): the streams are still clean.
    assert_clean_streams(rig.clients, rig.got, rig.sim, REGIONS, errors=True)


def test_a_member_that_cannot_start_is_a_clear_error_and_nothing_is_left(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = ProcessCluster("ws://127.0.0.1:9/", HashPartition(2), tmp_path / "d.db", dim=2)
        with pytest.raises(IntermediaryError, match=r"member p0 did not start.*cannot connect"):
            await cluster.start()
        assert cluster.members == {}
        await cluster.aclose()

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_loads_are_reported_through_the_directory_and_checked(tmp_path: Path) -> None:
    directory = Directory(tmp_path / "d.db")
    with pytest.raises(IntermediaryError, match="'ghost' is not a member"):
        directory.report(Load("ghost", 1, 2.0, 0, 1.0))
    directory.join("m", "ws://127.0.0.1:1/")
    directory.report(Load("m", 3, 40.0, 1, 5.0))
    directory.report(Load("m", 4, 41.0, 0, 6.0))
    assert Directory(tmp_path / "d.db").loads() == {"m": Load("m", 4, 41.0, 0, 6.0)}
    directory.leave("m")
    assert directory.loads() == {}


def test_a_region_partition_travels_to_member_processes() -> None:
    from tidings.intermediary.cluster.responsibility import partition_from, partition_spec
    from tidings.intermediary.regions.geometry import Box

    grid = RegionPartition(Box((0.0, 0.0), (100.0, 50.0)), (4, 2))
    assert partition_from(partition_spec(grid)) == grid
    assert partition_from(partition_spec(HashPartition(16))) == HashPartition(16)


def test_a_child_cancelled_while_it_starts_does_not_outlive_its_parent(tmp_path: Path) -> None:
    """The supervisor cancelled while a member starts (it is being closed): the member's
    process is ended, not left running without a parent that knows of it."""

    async def main() -> None:
        silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # never answers
        port = silent.sockets[0].getsockname()[1]
        plan = {
            "name": "p0",
            "directory": str(tmp_path / "d.db"),
            "partition": {"hash": 2},
            "dim": 2,
            "upstream": f"ws://127.0.0.1:{port}/",
            "host": "127.0.0.1",
            "round_s": 0.01,
            "report_s": 0.25,
        }
        process = await children.spawn("tidings.intermediary.cluster.member_process", plan)
        waiting = asyncio.create_task(children.ready(process, "member p0", 60))
        await asyncio.sleep(0.5)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert process.returncode is not None
        silent.close()

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_when_the_first_member_dies_its_split_becomes_the_root(tmp_path: Path) -> None:
    """The member everyone split from dies: its slots go to the member it had split off,
    which is nobody's split any more (so it is never merged into itself)."""

    async def main() -> None:
        publisher = SimulationServer(RecordedSimulation(), tick_hz=20)
        upstream = await publisher.start()
        path = tmp_path / "d.db"
        cluster = ProcessCluster(upstream, HashPartition(4), path, dim=2)
        try:
            first = await cluster.start()
            await cluster.split(first)
            assert cluster.parents == {"p1": "p0"}
            first.process.kill()
            await first.process.wait()
            assert await cluster.bury_dead() == ["p0"]
            assert list(cluster.members) == ["p1"] and cluster.parents == {}
            assert set(Directory(path).owners().values()) == {"p1"}
            assert [m.name for m in Directory(path).members()] == ["p1"]
        finally:
            await cluster.aclose()
            await publisher.aclose()

    asyncio.run(asyncio.wait_for(main(), WAIT))
