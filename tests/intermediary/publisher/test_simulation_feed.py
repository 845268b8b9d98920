"""A simulation feed's relevant set (:meth:`SimulationFeed.relevant`, all boxes in one grid
pass) is exactly the agents inside the union of its boxes, checked one agent and one box at
a time; small boxes, boxes larger than the grid's gathering limit and repeated ones alike."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.regions.geometry import Box

WORLD = Box((0.0, 0.0), (100.0, 100.0))


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 600),
    seed=st.integers(0, 2**16),
    boxes=st.lists(
        st.tuples(
            st.floats(-20, 110), st.floats(-20, 110), st.floats(0.01, 150), st.floats(0.01, 60)
        ),
        max_size=10,
    ),
    anchored=st.lists(st.tuples(st.integers(0, 10**6), st.floats(0.01, 30)), max_size=3),
)
def test_the_relevant_set_is_the_agents_inside_the_union_of_the_boxes(
    n: int,
    seed: int,
    boxes: list[tuple[float, float, float, float]],
    anchored: list[tuple[int, float]],
) -> None:
    sim = Simulation(n, WORLD, max_speed=5.0, seed=seed)
    sim.step(0.7)
    feed = sim.feed()
    regions = [Box((x, y), (x + w, y + h)) for x, y, w, h in boxes]
    # Boxes with a corner exactly on an agent: the boundary counts as inside.
    for agent, size in anchored:
        corner = sim.positions[agent % n].tolist()
        regions.append(Box(tuple(corner), tuple(c + size for c in corner)))
    feed.subscribe(regions)
    expected = [
        any(
            all(lo <= p <= hi for lo, p, hi in zip(box.lo, point, box.hi, strict=True))
            for box in regions
        )
        for point in sim.positions.tolist()
    ]
    np.testing.assert_array_equal(feed.relevant(), np.array(expected, dtype=bool))
