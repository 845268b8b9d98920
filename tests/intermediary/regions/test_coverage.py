"""Coverage of subscriber regions by the intermediary's upstream boxes (issue 12, item 3;
patent claims 1-3, [78]-[83], [155]).

The reference is brute force: sample many points of a region (random ones and a grid with
its boundary, kept where ``contains`` says so) and check each lies in some upstream box. On
boxes with integer corners the reference is exact: the region is covered iff the middle of
every unit cell in it is.
"""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.errors import IntermediaryError
from tidings.intermediary.regions import coverage
from tidings.intermediary.regions.coverage import UpstreamPolicy, add, covers, plan, uncovered
from tidings.intermediary.regions.geometry import Box, Relative, Sector, Sphere

SETTINGS = settings(max_examples=120, deadline=None)

# -- strategies: coordinates on a half-unit lattice, so boxes share edges often ------------

half = st.integers(-12, 12).map(lambda i: i / 2)
extent = st.integers(1, 10).map(lambda i: i / 2)


@st.composite
def boxes(draw: st.DrawFn, dim: int) -> Box:
    lo = [draw(half) for _ in range(dim)]
    return Box(tuple(lo), tuple(x + draw(extent) for x in lo))


@st.composite
def spheres(draw: st.DrawFn, dim: int) -> Sphere:
    radius = draw(st.one_of(extent, st.floats(0.1, 5)))
    return Sphere(tuple(draw(half) for _ in range(dim)), radius)


@st.composite
def sectors(draw: st.DrawFn, dim: int) -> Sector:
    direction = draw(st.lists(st.integers(-2, 2), min_size=dim, max_size=dim).filter(any))
    half_angle = draw(st.one_of(st.floats(0.05, math.pi), st.sampled_from([math.pi / 2])))
    radius = draw(st.one_of(extent, st.floats(0.1, 5)))
    return Sector(tuple(draw(half) for _ in range(dim)), radius, direction, half_angle)


def regions(dim: int) -> st.SearchStrategy:
    return st.one_of(boxes(dim), spheres(dim), sectors(dim))


dims = st.sampled_from([2, 3])

POLICIES = {
    "exact": UpstreamPolicy.exact(max_boxes=100_000),
    "bounding": UpstreamPolicy.bounding(),
    "margin": UpstreamPolicy.margin(0.75, max_boxes=100_000),
    "exact-few": UpstreamPolicy.exact(max_boxes=3),
    "margin-few": UpstreamPolicy.margin(0.5, max_boxes=4),
}
policies = st.sampled_from(sorted(POLICIES))
#: A seed of the random points a region is sampled with.
seeds = st.integers(0, 2**32 - 1)

# -- the brute-force reference -------------------------------------------------------------


def sample(region, rng: np.random.Generator, n: int = 600) -> np.ndarray:
    """Points of ``region``: random ones, a grid through its bounding box (faces, edges and
    corners included), and points along a sector's axis (a thin sector has few others)."""
    box = region.bounds()
    lo, hi = np.array(box.lo), np.array(box.hi)
    steps = 9 if region.dim == 3 else 25
    grid = np.stack(
        np.meshgrid(*(np.linspace(a, b, steps) for a, b in zip(lo, hi, strict=True))), axis=-1
    ).reshape(-1, region.dim)
    points = [rng.uniform(lo, hi, size=(n, region.dim)), grid]
    if isinstance(region, Sector):
        t = np.linspace(0, 1, 50).reshape(-1, 1)
        points.append(np.array(region.center) + t * region.radius * np.array(region.direction))
    points = np.vstack(points)
    return points[region.contains(points)]


def in_some_box(points: np.ndarray, upstream: list[Box]) -> np.ndarray:
    """Which points lie in at least one of the boxes (boundary included)."""
    if not upstream:
        return np.zeros(len(points), dtype=bool)
    lo = np.array([b.lo for b in upstream])
    hi = np.array([b.hi for b in upstream])
    inside = (points[:, None, :] >= lo[None]) & (points[:, None, :] <= hi[None])
    return inside.all(axis=2).any(axis=1)


def box_points(box: Box, rng: np.random.Generator, n: int = 200) -> np.ndarray:
    lo, hi = np.array(box.lo), np.array(box.hi)
    corners = np.array(np.meshgrid(*zip(lo, hi, strict=True))).reshape(box.dim, -1).T
    return np.vstack([rng.uniform(lo, hi, size=(n, box.dim)), corners])


def chebyshev_to(points: np.ndarray, targets: list[Box]) -> np.ndarray:
    """Each point's distance (max over axes) to the nearest of the boxes."""
    lo = np.array([b.lo for b in targets])
    hi = np.array([b.hi for b in targets])
    gap = np.maximum(lo[None] - points[:, None, :], points[:, None, :] - hi[None])
    return np.maximum(gap, 0).max(axis=2).min(axis=1)


def hull(targets: list[Box], grow: float = 0.0) -> Box:
    lo = np.min([b.lo for b in targets], axis=0) - grow
    hi = np.max([b.hi for b in targets], axis=0) + grow
    return Box(tuple(lo), tuple(hi))


# -- (a) after any sequence of subscribes, every live region is covered ---------------------


@SETTINGS
@given(data=st.data(), dim=dims, name=policies, seed=seeds)
def test_every_subscribed_region_stays_covered(data, dim: int, name: str, seed: int) -> None:
    policy = POLICIES[name]
    rng = np.random.default_rng(seed)
    live = data.draw(st.lists(regions(dim), min_size=1, max_size=7))
    upstream: list[Box] = []
    for region in live:
        before = upstream
        upstream, added = add(upstream, region, policy)
        assert set(added) <= set(upstream)
        assert set(upstream) - set(before) == set(added)
        assert len(upstream) <= policy.max_boxes
        if covers(before, region):
            assert (upstream, added) == (before, [])
        # what was upstream stays covered: only what is removed by merging goes, and it is
        # swallowed by what replaced it
        for box in before:
            assert in_some_box(box_points(box, rng, 50), upstream).all()
    for region in live:
        points = sample(region, rng)
        assert in_some_box(points, upstream).all(), (region, upstream)
        assert covers(upstream, region) or not isinstance(region, Box)


@SETTINGS
@given(data=st.data(), dim=dims, seed=seeds)
def test_the_margin_stops_at_the_world_edge(data, dim: int, seed: int) -> None:
    world = Box((-4.0,) * dim, (4.0,) * dim)
    rng = np.random.default_rng(seed)
    live = data.draw(st.lists(regions(dim), min_size=1, max_size=5))
    upstream: list[Box] = []
    policy = UpstreamPolicy.margin(3.0, max_boxes=100_000)
    for region in live:
        upstream, _ = add(upstream, region, policy, world=world)
    for region in live:
        assert in_some_box(sample(region, rng), upstream).all()
    # beyond the world, nothing upstream reaches farther than the regions themselves do
    outside = [box_points(box, rng) for box in upstream]
    for points in outside:
        beyond = np.any((points < -4.0) | (points > 4.0), axis=1)
        assert (chebyshev_to(points[beyond], [r.bounds() for r in live]) <= 1e-9).all()


# -- (b) after unsubscribes, the plan of what is left covers it and no more ---------------


@SETTINGS
@given(data=st.data(), dim=dims, name=policies, seed=seeds)
def test_plan_after_unsubscribe_covers_the_rest_and_no_more(
    data, dim: int, name: str, seed: int
) -> None:
    policy = POLICIES[name]
    rng = np.random.default_rng(seed)
    subscribed = data.draw(st.lists(regions(dim), min_size=1, max_size=7))
    keep = data.draw(st.lists(st.booleans(), min_size=len(subscribed), max_size=len(subscribed)))
    live = [region for region, kept in zip(subscribed, keep, strict=True) if kept]
    upstream = plan(live, policy)
    if not live:
        assert upstream == []
        return
    assert len(upstream) <= policy.max_boxes
    for region in live:
        assert in_some_box(sample(region, rng), upstream).all(), (region, upstream)
    live_bounds = [region.bounds() for region in live]
    points = np.vstack([box_points(box, rng) for box in upstream])
    if policy.kind == "bounding":
        assert upstream == [hull(live_bounds)]
    elif policy.max_boxes >= 100_000:
        # nothing upstream lies farther than the margin from some live region's bounding box
        assert (chebyshev_to(points, live_bounds) <= policy.distance + 1e-9).all()
    else:
        # merged to fit the bound: still inside the hull of the live regions, grown by the margin
        assert in_some_box(points, [hull(live_bounds, policy.distance + 1e-9)]).all()


def test_unsubscribing_shrinks_the_upstream_set() -> None:
    a, b = Box((0, 0), (1, 1)), Box((10, 10), (12, 12))
    policy = UpstreamPolicy.exact()
    upstream, _ = add([], a, policy)
    upstream, added = add(upstream, b, policy)
    assert added == [b] and set(upstream) == {a, b}
    assert plan([a], policy) == [a]
    assert plan([], policy) == []
    assert plan([a, b], UpstreamPolicy.bounding()) == [Box((0, 0), (12, 12))]


def test_plan_joins_pieces_that_make_one_box() -> None:
    quarters = [Box((x, y), (x + 1, y + 1)) for x in (0, 1) for y in (0, 1)]
    assert plan(quarters, UpstreamPolicy.exact()) == [Box((0, 0), (2, 2))]
    assert plan([Box((0, 0), (4, 4)), Box((1, 1), (2, 2))], UpstreamPolicy.exact()) == [
        Box((0, 0), (4, 4))
    ]


# -- (c) covers is exact on boxes, never wrong on spheres and sectors ----------------------


@st.composite
def lattice_boxes(draw: st.DrawFn, dim: int) -> Box:
    lo = [draw(st.integers(0, 5)) for _ in range(dim)]
    return Box(tuple(lo), tuple(x + draw(st.integers(1, 6 - x)) for x in lo))


def cell_middles(box: Box) -> np.ndarray:
    axes = [np.arange(a, b) + 0.5 for a, b in zip(box.lo, box.hi, strict=True)]
    return np.stack(np.meshgrid(*axes), axis=-1).reshape(-1, box.dim)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), dim=dims)
def test_covers_is_exact_on_boxes(data, dim: int) -> None:
    upstream = data.draw(st.lists(lattice_boxes(dim), max_size=8))
    region = data.draw(lattice_boxes(dim))
    middles = cell_middles(region)
    expected = bool(in_some_box(middles, upstream).all())
    assert covers(upstream, region) is expected
    pieces = uncovered(upstream, region)
    assert (pieces == []) is expected
    # the pieces: inside the region, disjoint, and exactly the cells no upstream box has
    for piece in pieces:
        assert covers([region], piece)
    for i, p in enumerate(pieces):
        for q in pieces[i + 1 :]:
            overlap = np.minimum(p.hi, q.hi) - np.maximum(p.lo, q.lo)
            assert (overlap <= 0).any()
    assert (in_some_box(middles, pieces) != in_some_box(middles, upstream)).all()


@settings(max_examples=100, deadline=None)
@given(data=st.data(), dim=dims, seed=seeds)
def test_a_grid_too_large_for_one_pass_is_split_with_the_same_answer(
    data, dim: int, seed: int
) -> None:
    """With a tiny one-pass limit every question is answered by halving the extent: the
    answers stay exact on boxes and never wrong on spheres and sectors."""
    upstream = data.draw(st.lists(lattice_boxes(dim), max_size=8))
    box = data.draw(lattice_boxes(dim))
    round_ = data.draw(st.one_of(spheres(dim), sectors(dim)))
    whole = covers(upstream, box)
    with mock.patch.object(coverage, "MAX_GRID_CELLS", 4):
        assert covers(upstream, box) is whole
        round_covered = covers(upstream, round_)
        pieces = uncovered(upstream, box)
        round_pieces = uncovered(upstream, round_)
    assert (round_pieces == []) is round_covered
    middles = cell_middles(box)
    assert (in_some_box(middles, pieces) != in_some_box(middles, upstream)).all()
    points = sample(round_, np.random.default_rng(seed))
    assert in_some_box(points, upstream + round_pieces).all()
    if round_covered:
        assert in_some_box(points, upstream).all()


def test_coverage_gives_up_with_a_clear_error_when_it_cannot_split() -> None:
    upstream = [Box((i, 0), (i + 0.5, 1)) for i in range(10)]
    with (
        mock.patch.object(coverage, "MAX_GRID_CELLS", 1),
        mock.patch.object(coverage, "_MAX_SPLITS", 0),
        pytest.raises(IntermediaryError, match=r"upstream: \d+ boxes cut a region too finely"),
    ):
        covers(upstream, Box((0, 0), (10, 1)))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), dim=dims, seed=seeds)
def test_covers_never_claims_a_sphere_or_sector_falsely(data, dim: int, seed: int) -> None:
    region = data.draw(st.one_of(spheres(dim), sectors(dim)))
    upstream = data.draw(st.lists(boxes(dim), max_size=8))
    points = sample(region, np.random.default_rng(seed), 1500)
    pieces = uncovered(upstream, region)
    if covers(upstream, region):
        assert pieces == []
        assert in_some_box(points, upstream).all(), (region, upstream)
    else:
        assert pieces
    # the uncovered pieces and the upstream boxes together hold all of the region
    assert in_some_box(points, upstream + pieces).all()
    bounds = region.bounds()
    for piece in pieces:
        assert covers([bounds], piece)


@pytest.mark.parametrize("dim", [2, 3])
def test_covers_on_spheres_is_not_blind(dim: int) -> None:
    """Conservative, but a sphere inside upstream boxes is seen as covered, also when they
    split it, and the corners of its bounding box are not asked for."""
    sphere = Sphere((0.0,) * dim, 1.0)
    assert covers([Box((-1.0,) * dim, (1.0,) * dim)], sphere)
    halves = [
        Box((-1.0,) * dim, (0.0,) + (1.0,) * (dim - 1)),
        Box((0.0,) + (-1.0,) * (dim - 1), (1.0,) * dim),
    ]
    assert covers(halves, sphere)
    # a box over the middle of the sphere leaves a frame; the corners of the frame lie
    # outside the sphere, and no piece asked for is only a corner
    middle = Box((-0.9,) * dim, (0.9,) * dim)
    pieces = uncovered([middle], sphere)
    assert pieces
    corner = np.array([[0.97] * dim])
    assert not sphere.contains(corner).any()
    assert not in_some_box(corner, pieces).any()


def test_a_sector_covered_by_the_half_it_points_into() -> None:
    ahead = Sector((0, 0), 2, (1, 0), math.pi / 3)
    assert covers([Box((0, -2), (2, 2))], ahead)
    assert not covers([Box((0, -2), (2, 1))], ahead)
    cone = Sector((0, 0, 0), 2, (0, 0, 1), 0.3)
    assert covers([Box((-1, -1, 0), (1, 1, 2))], cone)


# -- policies and bad input ----------------------------------------------------------------


def test_policies() -> None:
    sphere = Sphere((0, 0), 1)
    assert add([], sphere, UpstreamPolicy.exact())[0] == [Box((-1, -1), (1, 1))]
    grown, _ = add([], sphere, UpstreamPolicy.margin(0.5))
    assert grown == [Box((-1.5, -1.5), (1.5, 1.5))]
    world = Box((-1.2, -10), (10, 10))
    clipped, _ = add([], sphere, UpstreamPolicy.margin(0.5), world=world)
    assert clipped == [Box((-1.2, -1.5), (1.5, 1.5))]
    one, _ = add([Box((5, 5), (6, 6))], sphere, UpstreamPolicy.bounding())
    assert one == [Box((-1, -1), (6, 6))]
    # a subscription covered by the margin of an earlier one adds nothing
    _, added = add(grown, Sphere((0.3, 0.2), 1.1), UpstreamPolicy.margin(0.5))
    assert added == []


def test_the_box_count_stays_bounded() -> None:
    policy = UpstreamPolicy.exact(max_boxes=5)
    upstream: list[Box] = []
    live = [Box((i * 3.0, 0), (i * 3.0 + 1, 1)) for i in range(20)]
    for region in live:
        upstream, _ = add(upstream, region, policy)
        assert len(upstream) <= 5
    assert all(covers(upstream, region) for region in live)
    assert len(plan(live, policy)) <= 5


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: UpstreamPolicy.margin(-1), r"policy\.distance: must be in"),
        (lambda: UpstreamPolicy.margin(float("nan")), r"policy\.distance: must be in"),
        (lambda: UpstreamPolicy.margin(float("inf")), r"policy\.distance: must be in"),
        (lambda: UpstreamPolicy.exact(max_boxes=0), r"policy\.max_boxes: must be at least 1"),
        (lambda: UpstreamPolicy("nearest"), r"policy: unknown kind 'nearest'"),
        (
            lambda: covers([Box((0, 0, 0), (1, 1, 1))], Box((0, 0), (1, 1))),
            r"upstream\[0\]: has 3 dimensions, expected 2",
        ),
        (
            lambda: add([], Box((0, 0), (1, 1)), UpstreamPolicy.exact(), Box((0, 0, 0), (1, 1, 1))),
            r"world\[0\]: has 3 dimensions",
        ),
        (
            lambda: plan([Box((0, 0), (1, 1)), Sphere((0, 0, 0), 1)], UpstreamPolicy.exact()),
            r"live_regions\[1\]: has 3 dimensions, expected 2",
        ),
        (lambda: covers([(0, 0, 1, 1)], Box((0, 0), (1, 1))), r"upstream\[0\]: expected a Box"),
        (
            lambda: covers([], Relative(Sphere((0, 0), 1), "me")),
            r"region: a relative region is placed first",
        ),
        (
            lambda: plan([Box((0, 0), (1, 1)), {"box": 1}], UpstreamPolicy.exact()),
            r"live_regions\[1\]: expected a region",
        ),
    ],
)
def test_bad_arguments_are_refused(call, message: str) -> None:
    with pytest.raises(IntermediaryError, match=message):
        call()
