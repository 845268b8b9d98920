"""Slots of responsibility (issue 12 item 5): a region partition cuts any box into pieces,
one per cell it overlaps, that add up to the box; a subscription's home is one of the cells
its region overlaps; a hash partition places a client's id the same way every time."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.errors import IntermediaryError
from tidings.intermediary.cluster.responsibility import HashPartition, RegionPartition
from tidings.intermediary.regions.geometry import Box, Relative, Sphere

WORLD3 = Box((0.0, 0.0, 0.0), (90.0, 60.0, 30.0))
GRID = RegionPartition(WORLD3, (3, 2, 3))

coordinate = st.floats(0, 1, allow_nan=False)


@st.composite
def boxes(draw: st.DrawFn) -> Box:
    lo, hi = [], []
    for low, high in zip(WORLD3.lo, WORLD3.hi, strict=True):
        a, b = sorted((draw(coordinate), draw(coordinate)))
        if b - a < 1e-3:
            b = min(1.0, a + 1e-3)
            a = b - 1e-3
        lo.append(low + a * (high - low))
        hi.append(low + b * (high - low))
    return Box(tuple(lo), tuple(hi))


@settings(max_examples=200, deadline=None)
@given(boxes())
def test_the_pieces_of_a_box_are_inside_their_cells_and_add_up_to_it(box: Box) -> None:
    slots = GRID.areas(box)
    assert GRID.home(box) in slots
    pieces = [(slot, piece) for slot in slots for piece in GRID.clip(box, [slot])]
    for slot, piece in pieces:
        cell = GRID.cell(slot)
        assert all(
            c0 <= p0 and p1 <= c1
            for c0, p0, p1, c1 in zip(cell.lo, piece.lo, piece.hi, cell.hi, strict=True)
        )
    assert math.isclose(sum(p.volume() for _, p in pieces), box.volume(), rel_tol=1e-9)


def test_a_sphere_is_home_in_the_cell_of_its_middle_and_spans_the_cells_it_reaches() -> None:
    grid = RegionPartition(Box((0.0, 0.0), (100.0, 100.0)), (2, 2))
    sphere = Sphere((40.0, 40.0), 15.0)
    assert grid.home(sphere) == 0
    assert sorted(grid.areas(sphere)) == [0, 1, 2, 3]
    assert grid.areas(Sphere((20.0, 20.0), 5.0)) == [0]
    with pytest.raises(IntermediaryError, match="relative"):
        grid.home(Relative(Sphere((0.0, 0.0), 5.0), 7))
    with pytest.raises(IntermediaryError, match="cells"):
        RegionPartition(Box((0.0, 0.0), (1.0, 1.0)), (2,))


def test_a_hash_partition_places_a_client_the_same_way_and_needs_its_id() -> None:
    buckets = HashPartition(16)
    region = Sphere((1.0, 1.0), 1.0)
    homes = {buckets.home(region, f"client-{i}") for i in range(200)}
    assert homes == set(range(16))
    assert buckets.home(region, "alice") == HashPartition(16).home(region, "alice")
    with pytest.raises(IntermediaryError, match=r"request\.client"):
        buckets.home(region, None)
