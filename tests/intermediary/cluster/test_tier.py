"""A deployed tier of intermediaries (issue 29 item 5), run as a user runs it: a
``tidings intermediary simulate`` publisher and ``tidings intermediary serve --tier world``, real
subprocesses on real sockets, subscribers entering at any member. Responsibility is split
among three members, a view spans two of them, and a member SIGKILLed mid-stream has its
subscribers served by the others, then by its replacement, every frame its tick's brute
force (the publisher's simulation, replayed here from its seed). Waits are bounded so a broken
build fails instead of hanging; nothing asserts a timing."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.support import waiting
from tests.support.cli_runs import one_error_line, run_tidings
from tests.support.intermediary_helpers import inside
from tidings.intermediary.client.handover import ClusterClient
from tidings.intermediary.client.subscriber import ReceivedFrame
from tidings.intermediary.node.generation import FrameKind
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.regions.geometry import Box

pytestmark = pytest.mark.sockets

AGENTS, SIDE, SPEED, TICK_HZ, SEED = 300, 90.0, 5.0, 20.0, 3
#: Three members, one per 30-unit strip of the world along x (cells [3, 1]).
WEST = {"box": {"lo": [3, 5], "hi": [25, 40]}}
MIDDLE = {"box": {"lo": [35, 50], "hi": [55, 85]}}
EAST = {"box": {"lo": [65, 10], "hi": [88, 40]}}
#: Middle in the middle strip, reaching into the west one: a view spanning two members.
ACROSS = {"sphere": {"center": [40, 30], "radius": 15}}
#: Middle in the west strip, reaching into the middle one: when the middle member dies, the
#: west member (fewest cells, first) takes its cell and serves this view from its own state.
REACH = {"box": {"lo": [15, 50], "hi": [40, 80]}}
REGIONS = {"west": WEST, "middle": MIDDLE, "east": EAST, "across": ACROSS, "reach": REACH}
until = functools.partial(waiting.until, timeout=90.0, interval=0.05)


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Replay:
    """The publisher's positions at any tick: its simulation rebuilt from the same seed and
    stepped by the same period."""

    def __init__(self) -> None:
        self.sim = Simulation(AGENTS, Box((0.0, 0.0), (SIDE, SIDE)), max_speed=SPEED, seed=SEED)
        self.ticks: dict[int, np.ndarray] = {0: self.sim.positions.copy()}

    def at(self, tick: int) -> np.ndarray:
        while self.sim.tick < tick:
            self.sim.step(1.0 / TICK_HZ)
            self.ticks[self.sim.tick] = self.sim.positions.copy()
        return self.ticks[tick]


def check(frames: list[ReceivedFrame], spec: dict, replay: Replay) -> None:
    """Strictly increasing epochs; each frame its tick's brute-force view."""
    epochs = [f.header.epoch for f in frames]
    assert epochs == sorted(set(epochs)), "epochs out of order or repeated"
    for frame in frames:
        positions = replay.at(frame.header.epoch)
        expected = np.flatnonzero(inside(positions, spec))
        if frame.header.kind is FrameKind.VIEW:
            np.testing.assert_array_equal(frame.ids, expected)
            np.testing.assert_allclose(frame.world_positions(), positions[frame.ids])
        elif frame.header.kind is FrameKind.EMPTY:
            assert expected.size == 0


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tidings.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def first_line(process: subprocess.Popen[str], starting: str) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith(starting), line + process.stdout.read()
    return line


def member_pids(tier: subprocess.Popen[str]) -> dict[int, int]:
    """The tier's member processes by the port they listen on (from /proc)."""
    children = Path(f"/proc/{tier.pid}/task/{tier.pid}/children").read_text().split()
    found = {}
    for pid in map(int, children):
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd) if fd.is_symlink() else ""
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                found[int(fields[1].split(":")[1], 16)] = pid
    return found


async def read_into(got: dict[str, list[ReceivedFrame]], client: ClusterClient) -> None:
    """Put every frame ``client`` receives in ``got`` under its subscription's key."""
    async for frame in client.frames():
        got[frame.key].append(frame)


async def stop_reading(
    readers: list[asyncio.Task[None]], clients: dict[str, ClusterClient]
) -> None:
    """Cancel the :func:`read_into` tasks and close their clients."""
    for task in readers:
        task.cancel()
    for client in clients.values():
        await client.close()


def tier_file(
    tmp_path: Path, feed_port: int, ports: list[int], settings: dict[str, Any] | None = None
) -> Path:
    """A configuration file of one tier, ``world``: members on ``ports`` of 127.0.0.1, fed by
    the spatial publisher on ``feed_port`` (the world SIDE by SIDE), and ``settings``."""
    config = {
        "intermediary_tiers": {
            "world": {
                "members": [f"127.0.0.1:{port}" for port in ports],
                "spatial": {
                    "upstream": f"ws://127.0.0.1:{feed_port}/",
                    "world_lo": [0, 0],
                    "world_hi": [SIDE, SIDE],
                },
                **(settings or {}),
            }
        }
    }
    path = tmp_path / "tidings.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def deployment(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[list[str], subprocess.Popen[str]]]:
    """The publisher and a tier of three members (its settings: the test's parameter, by
    default responsibility by region in three strips along x)."""
    feed_port, *ports = free_ports(4)
    settings = getattr(request, "param", {"responsibility": {"by": "region", "cells": [3, 1]}})
    path = tier_file(tmp_path, feed_port, ports, settings)
    publisher = start(
        "intermediary", "simulate", "--agents", str(AGENTS), "--world", str(SIDE),
        "--speed", str(SPEED), "--tick-hz", str(TICK_HZ), "--seed", str(SEED),
        "--listen", f"127.0.0.1:{feed_port}",
    )  # fmt: skip
    tier = None
    try:
        first_line(publisher, "simulation of")
        tier = start("intermediary", "serve", "-c", str(path), "--tier", "world")
        first_line(tier, "intermediary tier world serving")
        yield [f"ws://127.0.0.1:{port}/" for port in ports], tier
    finally:
        end(tier, publisher)


def end(*processes: subprocess.Popen[str] | None) -> None:
    """SIGTERM each process started (SIGKILL to its group if it does not end in 30 s)."""
    for process in processes:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            assert process.stdout is not None
            process.stdout.close()


@pytest.mark.slow
def test_a_tier_splits_responsibility_and_survives_a_member_killed(
    deployment: tuple[list[str], subprocess.Popen[str]],
) -> None:
    urls, tier = deployment
    got: dict[str, list[ReceivedFrame]] = {key: [] for key in REGIONS}
    replay = Replay()
    timings: dict[str, float] = {}

    async def main() -> None:
        clients: dict[str, ClusterClient] = {}
        readers = []
        try:
            # Every subscriber enters at the west member: the tier redirects each to the
            # member owning its region's home.
            for key, region in REGIONS.items():
                client = await ClusterClient.connect(urls)
                await client.subscribe(key, region, rate_hz=1000)
                clients[key] = client
                readers.append(asyncio.create_task(read_into(got, client)))
            served = {key: client.where(key) for key, client in clients.items()}
            assert served == {
                "west": urls[0],
                "middle": urls[1],
                "east": urls[2],
                "across": urls[1],
                "reach": urls[0],
            }

            def more(keys: list[str], n: int = 10) -> Coroutine[Any, Any, None]:
                counts = {key: len(got[key]) for key in keys}
                return until(lambda: all(len(got[k]) > counts[k] + n for k in keys))

            await more(list(REGIONS))
            pids = member_pids(tier)
            assert len(set(pids.values())) == 3  # each member its own process

            # SIGKILL the middle member: "middle" and "across" lose their member, and "reach"
            # the piece it took from it; the tier notices and moves them.
            killed = int(urls[1].rsplit(":", 1)[1].rstrip("/"))
            before = {key: len(got[key]) for key in got}
            t0 = time.monotonic()
            os.kill(pids[killed], signal.SIGKILL)
            await until(
                lambda: (
                    all(clients[k].where(k) not in ("", urls[1]) for k in ("middle", "across"))
                    and all(len(got[k]) > before[k] for k in ("middle", "across"))
                )
            )
            timings["served by another member"] = time.monotonic() - t0
            await more(list(REGIONS))
            # The replacement on the killed member's address takes its share back: the
            # subscribers are handed over to it, make before break.
            await until(
                lambda: (
                    all(clients[k].where(k) == urls[1] for k in ("middle", "across"))
                    and not any(c.moving() for c in clients.values())
                )
            )
            timings["back on the replacement"] = time.monotonic() - t0
            await more(list(REGIONS))
            assert clients["west"].where("west") == urls[0]
            assert clients["east"].where("east") == urls[2]
            assert member_pids(tier)[killed] != pids[killed]
        finally:
            await stop_reading(readers, clients)
        for client in clients.values():
            assert client.stale == 0

    asyncio.run(asyncio.wait_for(main(), 300))
    print("failover:", {k: round(v, 2) for k, v in timings.items()})
    for key, region in REGIONS.items():
        check(got[key], region, replay)


@pytest.mark.slow  # four interpreters start, one after the other
def test_a_member_that_cannot_start_ends_the_tier_with_one_line(tmp_path: Path) -> None:
    """The publisher unreachable, then a member's address taken: exit 2, one line naming the
    member and why, and no member left running."""
    feed_port, *ports = free_ports(3)
    path = tier_file(tmp_path, feed_port, ports)
    line = one_error_line(run_tidings("intermediary", "serve", "-c", str(path), "--tier", "world"))
    assert "member world-0 did not start" in line and "cannot connect" in line
    publisher = start("intermediary", "simulate", "--listen", f"127.0.0.1:{feed_port}")
    taken = socket.create_server(("127.0.0.1", ports[1]))
    try:
        first_line(publisher, "simulation of")
        line = one_error_line(
            run_tidings("intermediary", "serve", "-c", str(path), "--tier", "world")
        )
        assert "member world-1 did not start" in line and f"{ports[1]}" in line
        with socket.create_server(("127.0.0.1", ports[0])):  # world-0 ended: its port is free
            pass
    finally:
        taken.close()
        publisher.send_signal(signal.SIGTERM)
        publisher.wait(30)
        assert publisher.stdout is not None
        publisher.stdout.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "deployment", [{"responsibility": {"by": "hash"}, "replace_dead": False}], indirect=True
)
def test_a_tier_by_hash_spreads_subscribers_and_the_others_take_a_dead_members(
    deployment: tuple[list[str], subprocess.Popen[str]],
) -> None:
    """Nine subscribers with their own ids, each entering at another member, land where the
    hash of their id says; the member serving most is SIGKILLed and not replaced: its
    subscribers are served by the two others, every frame its tick's brute force."""
    urls, tier = deployment
    specs = {f"k{i}": (WEST, MIDDLE, EAST)[i % 3] for i in range(9)}
    got: dict[str, list[ReceivedFrame]] = {key: [] for key in specs}

    async def main() -> None:
        clients: dict[str, ClusterClient] = {}
        readers = []
        try:
            for i, (key, region) in enumerate(specs.items()):
                entries = urls[i % 3 :] + urls[: i % 3]
                client = await ClusterClient.connect(entries, client_id=f"subscriber-{i}")
                await client.subscribe(key, region, rate_hz=1000)
                clients[key] = client
                readers.append(asyncio.create_task(read_into(got, client)))
            where = {key: client.where(key) for key, client in clients.items()}
            busiest = max(urls, key=lambda url: list(where.values()).count(url))
            moved = [key for key, url in where.items() if url == busiest]
            assert len(set(where.values())) > 1  # spread over several members
            counts = {key: len(got[key]) for key in got}
            await until(lambda: all(len(got[k]) > counts[k] + 10 for k in got))
            port = int(busiest.rsplit(":", 1)[1].rstrip("/"))
            before = {key: len(got[key]) for key in got}
            t0 = time.monotonic()
            os.kill(member_pids(tier)[port], signal.SIGKILL)
            await until(
                lambda: (
                    all(clients[k].where(k) not in ("", busiest) for k in moved)
                    and all(len(got[k]) > before[k] + 10 for k in got)
                )
            )
            print(f"failover by hash: {time.monotonic() - t0:.2f} s for {len(moved)} keys")
            assert port not in member_pids(tier)  # not replaced
        finally:
            await stop_reading(readers, clients)
        assert all(client.stale == 0 for client in clients.values())

    asyncio.run(asyncio.wait_for(main(), 300))
    replay = Replay()
    for key, region in specs.items():
        check(got[key], region, replay)


class CountingFeed:
    """A member's feed in another process as the member sees it: it counts the requests
    made and those its batches reflect (``applied``), which the test moves by hand. Fake
    because the real lag (a request crossing the wire while the publisher ticks) cannot be
    made to fall on one chosen round."""

    requested = 0
    applied = 0

    def subscribe(self, boxes: object) -> None:
        self.requested += 1

    def unsubscribe(self, boxes: object) -> None:
        self.requested += 1

    def follow(self, entities: object) -> None:
        pass


def test_cells_taken_over_give_no_frame_until_the_feed_applied_them() -> None:
    """Member a takes member b's cell (b died): a view reaching into it is not composed from
    a's own state until a's feed applied the request for that cell; a view inside a's old
    cell is served meanwhile."""
    from tidings.intermediary.cluster.directory import Directory
    from tidings.intermediary.cluster.member import ClusterServer
    from tidings.intermediary.cluster.responsibility import RegionPartition

    async def main() -> None:
        directory = Directory()
        directory.join("a", "ws://127.0.0.1:9/")
        directory.join("b", "ws://127.0.0.1:9/")
        directory.assign([0], "a")
        directory.assign([1], "b")
        partition = RegionPartition(Box((0.0, 0.0), (100.0, 50.0)), (2, 1))
        feed = CountingFeed()
        member = ClusterServer("a", feed, directory, partition, dim=2, remote_feed=True)
        node = member.intermediary
        node.subscribe(1, "across", {"box": {"lo": [30, 10], "hi": [70, 40]}}, 0.0, 10.0, None)
        node.subscribe(1, "west", {"box": {"lo": [5, 10], "hi": [20, 40]}}, 0.0, 10.0, None)
        records = {r.key: r for r in node.publishers.records()}
        feed.applied = feed.requested
        own = node.state.snapshot()
        assert member._compose(records["across"], own) is not None
        directory.assign([1], "a")
        directory.leave("b")
        assert member.refresh()
        assert feed.requested > feed.applied  # a asked its feed for the cell it took
        assert member._compose(records["across"], own) is None
        assert member._compose(records["west"], own) is not None
        feed.applied = feed.requested
        assert member._compose(records["across"], own) is not None
        await member.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.slow
def test_with_every_member_dead_a_new_one_takes_every_slot(tmp_path: Path) -> None:
    """Both members SIGKILLed, replace_dead off: the tier still starts one member (else
    nothing would serve), on the first seat, owning every slot, once the publisher it needs is
    back; the dead left the directory."""
    from tidings.config.intermediary_tier import IntermediaryTierConfig
    from tidings.intermediary.cluster.directory import Directory
    from tidings.intermediary.cluster.tier import Tier
    from tidings.intermediary.publisher.server import SimulationServer

    async def main() -> None:
        sim = Simulation(50, Box((0.0, 0.0), (SIDE, SIDE)), seed=1)
        publisher = SimulationServer(sim, tick_hz=20)
        upstream = await publisher.start()
        ports = free_ports(2)
        config = IntermediaryTierConfig.model_validate(
            {
                "members": [f"127.0.0.1:{port}" for port in ports],
                "spatial": {"upstream": upstream, "world_lo": [0, 0], "world_hi": [SIDE, SIDE]},
                "responsibility": {"by": "hash", "buckets": 8},
                "replace_dead": False,
            }
        )
        tier = Tier("t", config, tmp_path / "directory.db")
        try:
            members = await tier.start_all()
            assert Directory(tmp_path / "directory.db").owners() == {
                **{slot: "t-0" for slot in range(4)},
                **{slot: "t-1" for slot in range(4, 8)},
            }
            for member in members:
                member.process.kill()
                await member.process.wait()
            assert await tier.bury_dead() == ["t-0", "t-1"]
            assert tier.members == {} and tier.vacant == [0, 1]
            # The publisher away too: no member can start; the tier waits and tries again.
            await publisher.aclose()
            assert await tier.refill() is None and tier.vacant == [0, 1]
            await publisher.start("127.0.0.1", int(upstream.rsplit(":", 1)[1].rstrip("/")))
            heir = None
            for _ in range(100):
                if (heir := await tier.refill()) is not None:
                    break
                await asyncio.sleep(0.2)
            assert heir is not None and heir.url == f"ws://127.0.0.1:{ports[0]}/"
            directory = Directory(tmp_path / "directory.db")
            assert set(directory.owners().values()) == {heir.name}
            assert [m.name for m in directory.members()] == [heir.name]
            assert await tier.refill() is None  # replace_dead off: one member lives
        finally:
            await tier.aclose()
            await publisher.aclose()

    asyncio.run(asyncio.wait_for(main(), 120))
