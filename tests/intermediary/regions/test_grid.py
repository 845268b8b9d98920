"""The grid index the serving path selects views with: for any box, its candidates hold
every entity inside the box (against a brute-force test), ascending and without repeats."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.intermediary.regions.geometry import Box
from tidings.intermediary.regions.grid import GridIndex

coordinate = st.floats(-50, 150, allow_nan=False)


@settings(max_examples=150, deadline=None)
@given(
    dim=st.sampled_from([2, 3]),
    n=st.integers(0, 400),
    seed=st.integers(0, 2**16),
    corner=st.lists(coordinate, min_size=3, max_size=3),
    size=st.lists(st.floats(0.01, 120), min_size=3, max_size=3),
    clustered=st.booleans(),
)
def test_candidates_hold_every_entity_inside_the_box(
    dim: int, n: int, seed: int, corner: list[float], size: list[float], clustered: bool
) -> None:
    rng = np.random.default_rng(seed)
    positions = rng.uniform(0, 100, (n, dim))
    if clustered:  # many entities on one point, a few far away: a degenerate extent
        positions[: n // 2] = 42.0
    box = Box(
        tuple(corner[:dim]), tuple(c + s for c, s in zip(corner[:dim], size[:dim], strict=True))
    )
    inside = np.flatnonzero(box.contains(positions))
    rows = GridIndex(positions).candidates(box)
    if rows is None:  # too many cells: the caller tests every entity
        return
    assert np.all(np.diff(rows) > 0)
    assert set(inside.tolist()) <= set(rows.tolist())


def test_a_box_over_most_of_the_world_asks_for_a_full_pass() -> None:
    positions = np.random.default_rng(0).uniform(0, 1000, (50_000, 2))
    index = GridIndex(positions)
    assert index.candidates(Box((0.0, 0.0), (1000.0, 1000.0))) is None
    small = index.candidates(Box((100.0, 100.0), (120.0, 120.0)))
    assert small is not None and 0 < len(small) < 200


@settings(max_examples=100, deadline=None)
@given(
    dim=st.sampled_from([2, 3]),
    n=st.integers(0, 400),
    seed=st.integers(0, 2**16),
    boxes=st.lists(
        st.tuples(
            st.lists(coordinate, min_size=3, max_size=3),
            st.lists(st.floats(0.01, 120), min_size=3, max_size=3),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_candidates_of_many_boxes_at_once_are_each_boxs_candidates(
    dim: int, n: int, seed: int, boxes: list[tuple[list[float], list[float]]]
) -> None:
    positions = np.random.default_rng(seed).uniform(0, 100, (n, dim))
    index = GridIndex(positions)
    lo = np.array([corner[:dim] for corner, _ in boxes])
    hi = lo + np.array([size[:dim] for _, size in boxes])
    rows, owner, large = index.candidates_many(lo, hi)
    for k in range(len(boxes)):
        alone = index.candidates(Box(tuple(lo[k]), tuple(hi[k])))
        assert large[k] == (alone is None)
        mine = sorted(rows[owner == k].tolist())
        assert mine == ([] if alone is None else alone.tolist())
