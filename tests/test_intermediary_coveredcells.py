"""The coverage index moving regions are checked with: on boxes it answers exactly what the
coverage test answers (property-based), across box boundaries too."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.intermediary.coverage import covers
from tidings.intermediary.coveredcells import CoveredCells
from tidings.intermediary.geometry import Box

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
