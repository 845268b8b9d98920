"""One member of a cluster of intermediaries in its own OS process, for the multi-process
tests: ``python intermediary_node.py NAME DIRECTORY T0``.

Its publisher is the tests' seeded simulation, run in this process as a replica: the agents'
positions at tick ``t`` are the same in every process (same seed, same steps), and the tick is
the shared wall clock's ``floor((now - T0) / PERIOD)`` -- so the members see one publisher
ticking, as members fed by one network publisher would. The member joins the shared SQLite
directory with its URL, prints the URL, and serves until it is terminated.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

from tests.support.intermediary_helpers import WORLD
from tidings.intermediary.cluster.directory import Directory
from tidings.intermediary.cluster.member import ClusterServer
from tidings.intermediary.cluster.responsibility import RegionPartition
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.publisher.simulation import Simulation

AGENTS, SEED, SPEED, DT, PERIOD = 400, 7, 5.0, 0.05, 0.02
PARTITION = RegionPartition(WORLD, (2, 1))


def simulation() -> Simulation:
    """The publisher every process (and the test's brute-force reference) replays."""
    return Simulation(AGENTS, WORLD, max_speed=SPEED, seed=SEED)


async def main(name: str, path: str, t0: float) -> None:
    sim = simulation()
    feed = sim.feed()

    def source() -> list[UpdateBatch]:
        target = int((time.time() - t0) / PERIOD)
        if sim.tick >= target:
            return []
        while sim.tick < target:
            sim.step(DT)
        return [feed.batch()]

    directory = Directory(path)
    member = ClusterServer(
        name, feed, directory, PARTITION, dim=2, tick_s=PERIOD / 2, source=source
    )
    await member.start()
    directory.join(name, member.url)
    print(member.url, flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await member.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
