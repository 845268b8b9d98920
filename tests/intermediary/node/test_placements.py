"""Relative subscriptions placed once per epoch (:mod:`tidings.intermediary.node.placements`)
answer exactly what placing each on its own answers, and follow the state to a new epoch."""

from __future__ import annotations

import numpy as np

from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.placements import Placements, place
from tidings.intermediary.node.state import StateStore
from tidings.intermediary.regions.geometry import Box, Relative, Sphere

NEAR = Sphere((0.0, 0.0), 5.0)


def test_each_placement_is_what_place_and_position_of_give_and_a_new_epoch_moves_them() -> None:
    store = StateStore(2)
    ids = np.array([3, 8, 20, 41])
    store.apply(UpdateBatch(ids=ids, positions=np.array([[1, 2], [10, 20], [50, 50], [9, 9.0]])))
    store.end_epoch()
    subscriptions = [
        Relative(NEAR, 8),
        Relative(NEAR, 41),
        Relative(NEAR, 8),  # the same one twice
        Relative(NEAR, 7),  # not in the state
        Relative(NEAR, "a name"),  # not an integer id
        Relative(NEAR, 2**70),  # beyond int64
        Relative(Sphere((0.0, 0.0), 1e9 - 1), 20),  # placed beyond the world's extent
        Box((0.0, 0.0), (5.0, 5.0)),  # absolute
    ]
    placements = Placements()
    for snapshot in (store.snapshot(), None):
        if snapshot is None:  # the next epoch: 8 moved
            store.apply(UpdateBatch(ids=np.array([8]), positions=np.array([[30.0, 31.0]])))
            store.end_epoch()
            snapshot = store.snapshot()
        placements.place_all(subscriptions, snapshot)
        for subscription in subscriptions:
            region, own = placements.place(subscription, snapshot)
            assert region == place(subscription, snapshot)
            if isinstance(subscription, Relative) and not isinstance(region, str):
                assert own is not None
                np.testing.assert_array_equal(own, snapshot.position_of(subscription.entity_id))
            else:
                assert own is None
    assert placements.place(Relative(NEAR, 8), snapshot)[0] == Sphere((30.0, 31.0), 5.0)
    # One never prepared is placed on first use.
    assert Placements().place(Relative(NEAR, 3), snapshot)[0] == Sphere((1.0, 2.0), 5.0)
