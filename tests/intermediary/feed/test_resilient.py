"""A :class:`ResilientFeed` over real publishers on a real socket: stopped and another
started on the same port (with other agents), the feed is stale meanwhile, keeps the
operations asked then, and on the new connection re-subscribes them and replaces the
state with the new publisher's."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from tests.support.intermediary_helpers import WORLD
from tests.support.waiting import run, until
from tidings.errors import IntermediaryError
from tidings.intermediary.feed.resilient import ResilientFeed
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.publisher.server import SimulationServer
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.regions.geometry import Box

pytestmark = pytest.mark.sockets

LEFT = Box((0.0, 0.0), (50.0, 100.0))
RIGHT = Box((50.0, 0.0), (100.0, 100.0))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_a_lost_publisher_is_ridden_out_and_the_state_replaced_by_the_new_one() -> None:
    async def main() -> None:
        port = _free_port()
        held = np.empty(0, np.int64)
        publisher = SimulationServer(Simulation(500, WORLD, max_speed=5.0, seed=1), 20.0)
        url = await publisher.start("127.0.0.1", port)
        feed = await ResilientFeed.connect(
            [f"ws://127.0.0.1:{_free_port()}/", url], 2, lambda: held
        )
        try:
            feed.subscribe([LEFT])
            taken: list[UpdateBatch] = []

            def ingest() -> bool:
                nonlocal held
                for batch in feed.take():
                    taken.append(batch)
                    held = np.setdiff1d(np.union1d(held, np.asarray(batch.ids)), batch.delete)
                return bool(held.size) and feed.applied == feed.requested

            await until(ingest, 30)
            assert held.max() >= 100
            await publisher.aclose()
            await until(lambda: feed.stale is not None, 30)
            feed.subscribe([RIGHT])  # while stale: kept, not yet reflected
            assert feed.requested == 2 and feed.applied == 1
            with pytest.raises(IntermediaryError, match="is not subscribed"):
                feed.unsubscribe([Box((1.0, 1.0), (2.0, 2.0))])
            before = len(taken)
            publisher = SimulationServer(Simulation(100, WORLD, max_speed=5.0, seed=2), 20.0)
            await publisher.start("127.0.0.1", port)
            await until(lambda: ingest() and feed.stale is None, 30)
            assert feed.reconnects == 1
            assert held.size and held.max() < 100  # the first publisher's agents are gone
            # Both boxes were subscribed again: the new state has agents on either side.
            whole = max(taken[before:], key=lambda b: len(np.asarray(b.ids)))
            x = np.asarray(whole.positions)[:, 0]
            assert (x < 50).any() and (x > 50).any()
        finally:
            await feed.aclose()
            await publisher.aclose()

    run(main(), 120)
