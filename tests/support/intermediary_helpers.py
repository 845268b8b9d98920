"""Shared by the intermediary process and transport tests: the 2D world they simulate, the
regions their subscribers ask for, and the brute-force reference a view is checked against."""

from __future__ import annotations

from typing import Any

import numpy as np

from tidings.intermediary.node.generation import FrameKind
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.regions.geometry import Box

WORLD = Box((0.0, 0.0), (100.0, 100.0))
WHOLE = {"box": {"lo": [0, 0], "hi": [100, 100]}}
SMALL = {"sphere": {"center": [30, 40], "radius": 15}}


def inside(positions: np.ndarray, spec: dict) -> np.ndarray:
    """Which agents a box or (relative) sphere subscription holds, one agent at a time in
    spirit: plain comparisons and distances, none of the code under test."""
    if "box" in spec:
        lo, hi = np.array(spec["box"]["lo"]), np.array(spec["box"]["hi"])
        return np.all((positions >= lo) & (positions <= hi), axis=1)
    center = np.array(spec["sphere"]["center"], dtype=float)
    if "relative_to" in spec:
        center = center + positions[spec["relative_to"]]
    return np.linalg.norm(positions - center, axis=1) <= spec["sphere"]["radius"]


class RecordedSimulation(Simulation):
    """The real simulation, keeping every tick's positions for the brute-force check."""

    def __init__(self) -> None:
        super().__init__(400, WORLD, max_speed=5.0, seed=7)
        self.history: dict[int, np.ndarray] = {}

    def step(self, dt: float) -> None:
        super().step(dt)
        self.history[self.tick] = self.positions.copy()


def assert_clean_streams(
    clients: list[Any],
    got: dict[str, list[Any]],
    sim: RecordedSimulation,
    regions: list[dict],
    *,
    errors: bool = False,
) -> None:
    """Each client ``i``'s key ``k{i}`` (region ``regions[i % len]``): no stale frame (nor
    error, unless ``errors``), epochs strictly increasing, and every frame its tick's
    brute-force view."""
    for i, client in enumerate(clients):
        assert client.stale == 0 and (errors or not client.errors)
        frames = got[f"k{i}"]
        epochs = [f.header.epoch for f in frames]
        assert epochs == sorted(set(epochs)), f"k{i}: epochs out of order or repeated"
        for frame in frames:
            positions = sim.history[frame.header.epoch]
            expected = np.flatnonzero(inside(positions, regions[i % len(regions)]))
            if frame.header.kind is FrameKind.VIEW:
                np.testing.assert_array_equal(frame.ids, expected)
                np.testing.assert_allclose(frame.world_positions(), positions[frame.ids])
            elif frame.header.kind is FrameKind.EMPTY:
                assert expected.size == 0
