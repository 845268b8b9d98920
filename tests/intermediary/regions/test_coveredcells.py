"""The coverage index moving regions are checked with: on boxes it answers exactly what the
coverage test answers (property-based), across box boundaries too; on spheres and sectors it
never claims a region that has a point outside every box, and on spheres it settles at least
what the exact test settles."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.intermediary.regions.coverage import covers
from tidings.intermediary.regions.coveredcells import CoveredCells
from tidings.intermediary.regions.geometry import Box, Sector, Sphere

coordinate = st.floats(-100, 100, allow_nan=False)
extent = st.floats(0.001, 80, allow_nan=False)


@st.composite
def boxes(draw: st.DrawFn, dim: int) -> Box:
    lo = [draw(coordinate) for _ in range(dim)]
    return Box(tuple(lo), tuple(x + draw(extent) for x in lo))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), dim=st.sampled_from([2, 3]))
def test_covered_cells_never_claim_what_the_exact_test_denies(
    data: st.DataObject, dim: int
) -> None:
    upstream = data.draw(st.lists(boxes(dim), max_size=12))
    asked = data.draw(boxes(dim))
    if CoveredCells(upstream).covers(asked):
        assert covers(upstream, asked)


def test_a_box_across_two_boxes_is_covered() -> None:
    upstream = [Box((0.0, 0.0), (50.0, 100.0)), Box((50.0, 0.0), (100.0, 100.0))]
    cells = CoveredCells(upstream)
    assert cells.covers(Box((10.0, 10.0), (20.0, 20.0)))
    assert cells.covers(Box((40.0, 10.0), (60.0, 20.0)))  # across the two boxes
    assert not cells.covers(Box((90.0, 90.0), (110.0, 95.0)))  # reaches outside
    assert not CoveredCells([]).covers(Box((1.0, 1.0), (2.0, 2.0)))
    # The same questions at once; and boxes starting or ending on a boundary next to a gap.
    apart = CoveredCells([Box((0.0, 0.0), (10.0, 10.0)), Box((20.0, 0.0), (30.0, 10.0))])
    lo = np.array([[10.0, 10.0], [40.0, 10.0], [90.0, 90.0], [20.0, 0.0], [5.0, 0.0], [9.0, 0.0]])
    hi = np.array(
        [[20.0, 20.0], [60.0, 20.0], [110.0, 95.0], [25.0, 5.0], [10.0, 10.0], [21.0, 1.0]]
    )
    assert cells.covers_bounds(lo[:3], hi[:3]).tolist() == [True, True, False]
    assert apart.covers_bounds(lo[3:], hi[3:]).tolist() == [True, True, False]
    assert CoveredCells([]).covers_bounds(lo, hi).tolist() == [False] * 6


@settings(max_examples=300, deadline=None)
@given(data=st.data(), dim=st.sampled_from([2, 3]))
def test_many_boxes_at_once_answer_as_one_at_a_time(data: st.DataObject, dim: int) -> None:
    """``covers_bounds`` (a summed-area table, for the moving regions of an epoch) answers
    each box exactly as ``covers`` does, boxes on the upstream boundaries included."""
    upstream = data.draw(st.lists(boxes(dim), max_size=12))
    cells = CoveredCells(upstream)
    edges = sorted({x for box in upstream for x in (*box.lo, *box.hi)})
    on_edge = st.sampled_from(edges) if edges else coordinate
    asked = []
    for _ in range(data.draw(st.integers(0, 20))):
        lo = [data.draw(st.one_of(coordinate, on_edge)) for _ in range(dim)]
        hi = [data.draw(st.one_of(coordinate, on_edge)) for _ in range(dim)]
        lo, hi = np.minimum(lo, hi), np.maximum(lo, hi) + data.draw(st.sampled_from([0.0, 1.0]))
        if np.all(lo < hi):
            asked.append(Box(tuple(lo.tolist()), tuple(hi.tolist())))
    lo = np.array([box.lo for box in asked], dtype=np.float64).reshape(-1, dim)
    hi = np.array([box.hi for box in asked], dtype=np.float64).reshape(-1, dim)
    assert cells.covers_bounds(lo, hi).tolist() == [cells.covers(box) for box in asked]
    assert [cells.covers(box) for box in asked] == [covers(upstream, box) for box in asked]


@st.composite
def round_regions(draw: st.DrawFn, dim: int) -> Sphere | Sector:
    center = tuple(draw(coordinate) for _ in range(dim))
    radius = draw(st.floats(0.01, 60))
    if draw(st.booleans()):
        return Sphere(center, radius)
    direction = tuple(draw(st.floats(-1, 1)) for _ in range(dim))
    if not any(direction):
        direction = (1.0, *direction[1:])
    return Sector(center, radius, direction, draw(st.floats(0.05, np.pi)))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), dim=st.sampled_from([2, 3]))
def test_covers_region_is_sound_and_exact_on_boxes(data: st.DataObject, dim: int) -> None:
    # Upstream boxes often overlapping the asked region, so both answers occur.
    upstream = data.draw(st.lists(boxes(dim), max_size=12))
    cells = CoveredCells(upstream)
    asked = data.draw(boxes(dim))
    assert cells.covers_region(asked) == covers(upstream, asked)
    region = data.draw(round_regions(dim))
    if cells.covers_region(region):
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        bounds = region.bounds()
        points = rng.uniform(bounds.lo, bounds.hi, (2000, dim))
        points = points[region.contains(points)]
        held = np.zeros(len(points), dtype=bool)
        for box in upstream:
            held |= box.contains(points)
        assert held.all()
    if isinstance(region, Sphere) and covers(upstream, region):
        assert cells.covers_region(region)


def test_a_sphere_across_boxes_is_covered_and_one_reaching_a_gap_is_not() -> None:
    # Its bounding box reaches the uncovered corner square; the disc itself does not.
    upstream = [Box((0.0, 0.0), (10.0, 8.0)), Box((0.0, 8.0), (8.0, 10.0))]
    cells = CoveredCells(upstream)
    assert not cells.covers(Sphere((5.0, 5.0), 4.0).bounds())
    assert cells.covers_region(Sphere((5.0, 5.0), 4.0))
    assert not cells.covers_region(Sphere((8.5, 8.5), 1.0))  # inside the gap
    assert cells.covers_region(Sector((5.0, 5.0), 4.9, (-1.0, 0.0), 0.3))
    assert not cells.covers_region(Sector((5.0, 5.0), 6.0, (1.0, 1.0), 0.3))
    assert not CoveredCells([]).covers_region(Sphere((1.0, 1.0), 1.0))
