"""The simulation publisher's agents: they move in straight lines and bounce off the world's
walls, a step longer than the world folding back as many times as needed; checked against a
plain per-agent reflection, one wall at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.errors import IntermediaryError
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.regions.geometry import Box


def reflected(x: float, v: float, dt: float, lo: float, hi: float) -> tuple[float, float]:
    """One coordinate after ``dt``, bouncing between ``lo`` and ``hi`` wall by wall."""
    left = abs(v) * dt
    sign = 1.0 if v >= 0 else -1.0
    while left > 0:
        wall = hi if sign > 0 else lo
        room = abs(wall - x)
        if left <= room:
            x += sign * left
            break
        x, left, sign = wall, left - room, -sign
    return x, sign * abs(v)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(1, 60),
    dt=st.one_of(st.floats(0.0, 2.0), st.floats(2.0, 80.0)),
    dim=st.sampled_from([2, 3]),
)
def test_agents_bounce_off_the_walls_and_never_leave(
    seed: int, n: int, dt: float, dim: int
) -> None:
    world = Box((-5.0,) * dim, (10.0,) * dim)
    sim = Simulation(n, world, max_speed=7.0, seed=seed)
    before, velocities = sim.positions.copy(), sim.velocities.copy()
    sim.step(dt)
    assert np.all(sim.positions >= -5.0) and np.all(sim.positions <= 10.0)
    for i in range(n):
        for axis in range(dim):
            x, v = reflected(before[i, axis], velocities[i, axis], dt, -5.0, 10.0)
            assert math.isclose(sim.positions[i, axis], x, abs_tol=1e-9), (i, axis)
            if abs(x - sim.positions[i, axis]) < 1e-9 and not math.isclose(
                abs(x - world.lo[axis]) * abs(x - world.hi[axis]), 0.0, abs_tol=1e-12
            ):  # on a wall the sign is a tie
                assert sim.velocities[i, axis] == pytest.approx(v), (i, axis)
    assert sim.tick == 1


def test_a_bad_step_is_refused() -> None:
    sim = Simulation(3, Box((0.0, 0.0), (1.0, 1.0)))
    for dt in (-1.0, math.nan, math.inf):
        with pytest.raises(IntermediaryError, match="dt must be finite and >= 0"):
            sim.step(dt)
