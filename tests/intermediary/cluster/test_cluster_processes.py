"""Members of a cluster of intermediaries in separate OS processes sharing a SQLite directory
(issue 12 item 5): a request at the wrong member is redirected, handovers follow the
directory across processes both ways, a view spanning both areas is right, a dead member
named by the directory gives a clear error while the others go on, and once the directory
names a live member the client's subscriptions recover there. Frames are checked against the
publisher replayed in this process (``intermediary_node.simulation``). Waits are bounded
only so that a broken build fails instead of hanging; nothing asserts a timing."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support import intermediary_node as node
from tests.support import waiting
from tests.support.intermediary_helpers import inside
from tidings.errors import IntermediaryError
from tidings.intermediary.client.handover import ClusterClient
from tidings.intermediary.client.subscriber import ReceivedFrame
from tidings.intermediary.cluster.directory import Directory
from tidings.intermediary.node.generation import FrameKind

pytestmark = pytest.mark.sockets

ROOT = Path(__file__).resolve().parents[3]
WEST = {"box": {"lo": [5, 5], "hi": [30, 40]}}
EAST = {"box": {"lo": [60, 10], "hi": [90, 40]}}
ACROSS = {"sphere": {"center": [55, 50], "radius": 20}}  # middle in the east, reaches west


class Replay:
    """The publisher's positions at any tick, replayed."""

    def __init__(self) -> None:
        self.sim = node.simulation()
        self.ticks: dict[int, np.ndarray] = {0: self.sim.positions.copy()}

    def at(self, tick: int) -> np.ndarray:
        while self.sim.tick < tick:
            self.sim.step(node.DT)
            self.ticks[self.sim.tick] = self.sim.positions.copy()
        return self.ticks[tick]


def check(frames: list[ReceivedFrame], spec: dict, replay: Replay) -> None:
    """Strictly increasing epochs; each VIEW equal to the brute-force view of its tick."""
    epochs = [f.header.epoch for f in frames]
    assert epochs == sorted(set(epochs)), epochs
    for frame in frames:
        positions = replay.at(frame.header.epoch)
        expected = np.flatnonzero(inside(positions, spec))
        if frame.header.kind is FrameKind.EMPTY:
            assert expected.size == 0
        elif frame.header.kind is FrameKind.VIEW:
            np.testing.assert_array_equal(frame.ids, expected)
            np.testing.assert_allclose(frame.world_positions(), positions[frame.ids])


@pytest.fixture
def members(tmp_path: Path) -> Iterator[tuple[Directory, dict[str, subprocess.Popen[str]]]]:
    path = tmp_path / "directory.sqlite"
    directory = Directory(path)
    t0 = time.time()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "support" / "intermediary_node.py"),
                name,
                str(path),
                str(t0),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in ("a", "b")
    }
    try:
        for proc in procs.values():
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("ws://")  # bounded by pytest's timeout
        directory.assign([0], "a")  # x < 50
        directory.assign([1], "b")  # x >= 50
        yield directory, procs
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        directory.close()


#: Members are processes: a handover here may take longer than the default wait.
until = functools.partial(waiting.until, timeout=30.0)


def test_members_in_separate_processes_redirect_hand_over_and_outlive_a_dead_one(
    members: tuple[Directory, dict[str, subprocess.Popen[str]]],
) -> None:
    directory, procs = members
    a, b = directory.member("a").url, directory.member("b").url
    specs = {"west": WEST, "east": EAST, "across": ACROSS}

    async def body() -> None:
        client = await ClusterClient.connect(a)
        got: dict[str, list[ReceivedFrame]] = {key: [] for key in specs}

        async def read() -> None:
            async for frame in client.frames():
                got[frame.key].append(frame)

        reader = asyncio.create_task(read())
        replies = {
            key: await client.subscribe(key, spec, rate_hz=100) for key, spec in specs.items()
        }
        assert [replies[k]["intermediary"] for k in specs] == ["a", "b", "b"]
        assert client.where("east") == b and client.where("west") == a
        await until(lambda: all(len(frames) >= 10 for frames in got.values()))

        async def more_frames(keys: tuple[str, ...] = tuple(specs)) -> None:
            counts = {key: len(got[key]) for key in keys}
            await until(lambda: all(len(got[k]) >= counts[k] + 10 for k in keys))

        # The directory gives b's cell to a, then back: the members hand the subscriptions
        # over by themselves, each way.
        directory.assign([1], "a")
        await until(lambda: client.handovers == 2 and not client.moving())
        assert client.where("east") == a and client.where("across") == a
        await more_frames()
        directory.assign([1], "b")
        await until(lambda: client.handovers == 4 and not client.moving())
        assert client.where("east") == b and client.where("across") == b
        await more_frames()

        # b dies while the directory still names it: the client tries again and says why,
        # a newcomer gets a clear error, and a goes on serving what it holds.
        procs["b"].kill()
        procs["b"].wait(10)
        unreachable = "cannot reach intermediary 'b'"
        await until(
            lambda: (
                len(client.errors) == 2 and all(unreachable in e for e in client.errors.values())
            )
        )
        newcomer = await ClusterClient.connect(a)
        with pytest.raises(IntermediaryError, match="cannot reach intermediary 'b'"):
            await newcomer.subscribe("east", EAST)
        await newcomer.close()
        await more_frames(("west",))
        # The operator gives b's cell to a: the client's retries land there.
        directory.assign([1], "a")
        await until(lambda: not client.errors and not client.moving())
        assert client.where("east") == a and client.where("across") == a
        await more_frames()
        reader.cancel()
        await client.close()
        assert client.stale == 0
        replay = Replay()
        for key, spec in specs.items():
            check(got[key], spec, replay)

    asyncio.run(asyncio.wait_for(body(), 120))
