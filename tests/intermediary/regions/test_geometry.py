"""Spatial regions of the intermediary (issue 12, item 2a; patent [68]-[72]).

Containment is checked against a scalar, per-point reference written independently (distances
with math.dist, angles with math.acos), the bounding boxes against points on each region's
surface, and every kind of bad input against the field its refusal must name.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.errors import IntermediaryError
from tidings.intermediary.regions.geometry import (
    MAX_EXTENT,
    Box,
    Relative,
    Sector,
    Sphere,
    dump_region,
    parse_region,
)

SETTINGS = settings(max_examples=150, deadline=None)

# -- strategies ----------------------------------------------------------------------------

coordinate = st.floats(-50, 50, allow_nan=False, allow_infinity=False)
size = st.floats(0.1, 20, allow_nan=False, allow_infinity=False)


@st.composite
def boxes(draw: st.DrawFn, dim: int | None = None) -> Box:
    dim = dim or draw(st.sampled_from([2, 3]))
    lo = [draw(coordinate) for _ in range(dim)]
    return Box(tuple(lo), tuple(x + draw(size) for x in lo))


@st.composite
def spheres(draw: st.DrawFn, dim: int | None = None) -> Sphere:
    dim = dim or draw(st.sampled_from([2, 3]))
    return Sphere(tuple(draw(coordinate) for _ in range(dim)), draw(size))


@st.composite
def sectors(draw: st.DrawFn, dim: int | None = None) -> Sector:
    dim = dim or draw(st.sampled_from([2, 3]))
    direction = draw(
        st.lists(st.floats(-1, 1), min_size=dim, max_size=dim).filter(
            lambda v: max(abs(x) for x in v) > 1e-3
        )
    )
    half_angle = draw(st.one_of(st.floats(0.02, math.pi), st.sampled_from([math.pi / 2, math.pi])))
    return Sector(tuple(draw(coordinate) for _ in range(dim)), draw(size), direction, half_angle)


regions = st.one_of(boxes(), spheres(), sectors())

# -- the scalar reference ------------------------------------------------------------------

BAND = 1e-7


def reference(region: Box | Sphere | Sector, point: list[float]) -> bool | None:
    """Whether ``point`` is in ``region``, one point at a time; None when it lies within a
    rounding band of the boundary (where float arithmetic may answer either way)."""
    if isinstance(region, Box):
        gaps = [x - a for x, a in zip(point, region.lo, strict=True)]
        gaps += [b - x for x, b in zip(point, region.hi, strict=True)]
        if any(abs(g) < BAND for g in gaps):
            return None
        return all(g >= 0 for g in gaps)
    distance = math.dist(point, region.center)
    if abs(distance - region.radius) < BAND * (region.radius + 1):
        return None
    if distance > region.radius:
        return False
    if isinstance(region, Sphere) or region.half_angle == math.pi:
        return True
    if distance < BAND:
        return None
    offset = [x - c for x, c in zip(point, region.center, strict=True)]
    cosine = sum(a * b for a, b in zip(offset, region.direction, strict=True)) / distance
    angle = math.acos(max(-1.0, min(1.0, cosine)))
    if abs(angle - region.half_angle) < BAND:
        return None
    return angle <= region.half_angle


def around(region: Box | Sphere | Sector, rng: np.random.Generator, n: int = 400) -> np.ndarray:
    """Random points in the region's bounding box grown by a half on every side."""
    box = region.bounds()
    lo, hi = np.array(box.lo), np.array(box.hi)
    pad = (hi - lo) / 2
    return rng.uniform(lo - pad, hi + pad, size=(n, region.dim))


# -- (d) containment agrees with the reference ---------------------------------------------


@SETTINGS
@given(region=regions, seed=st.integers(0, 2**32 - 1))
def test_contains_agrees_with_a_scalar_reference(region, seed: int) -> None:
    points = around(region, np.random.default_rng(seed))
    inside = region.contains(points)
    assert inside.shape == (len(points),)
    assert inside.dtype == bool
    for point, got in zip(points.tolist(), inside.tolist(), strict=True):
        expected = reference(region, point)
        if expected is not None:
            assert got == expected, (region, point)


@SETTINGS
@given(region=regions, seed=st.integers(0, 2**32 - 1))
def test_contained_points_lie_in_the_bounding_box(region, seed: int) -> None:
    points = around(region, np.random.default_rng(seed), 2000)
    inside = points[region.contains(points)]
    box = region.bounds()
    assert np.all(inside >= np.array(box.lo)) and np.all(inside <= np.array(box.hi))


def surface(region: Sphere | Sector, steps: int = 241) -> np.ndarray:
    """Points on the region's curved surface (and its apex), densely: where it reaches
    farthest along every axis."""
    c = np.array(region.center)
    if isinstance(region, Sphere):
        u, half_angle = np.eye(region.dim)[0], math.pi
    else:
        u, half_angle = np.array(region.direction), region.half_angle
    if region.dim == 2:
        phi = math.atan2(u[1], u[0]) + np.linspace(-half_angle, half_angle, steps)
        directions = np.stack([np.cos(phi), np.sin(phi)], axis=1)
    else:
        helper = np.eye(3)[int(np.argmin(np.abs(u)))]
        e1 = np.cross(u, helper)
        e1 /= np.linalg.norm(e1)
        e2 = np.cross(u, e1)
        t, psi = np.meshgrid(np.linspace(0, half_angle, steps), np.linspace(0, 2 * math.pi, steps))
        t, psi = t.reshape(-1, 1), psi.reshape(-1, 1)
        directions = np.cos(t) * u + np.sin(t) * (np.cos(psi) * e1 + np.sin(psi) * e2)
    return np.vstack([c + region.radius * directions, c])


@SETTINGS
@given(region=st.one_of(spheres(), sectors()))
def test_bounding_boxes_are_tight(region) -> None:
    """Every surface point is inside the box, and the box's faces are reached: the extremes
    of a dense sample of the surface come within a hair of them."""
    points = surface(region)
    box = region.bounds()
    lo, hi = np.array(box.lo), np.array(box.hi)
    slack = 1e-9 * (region.radius + np.abs(np.array(region.center)).max())
    assert np.all(points >= lo - slack) and np.all(points <= hi + slack)
    assert np.allclose(points.min(axis=0), lo, atol=2e-3 * region.radius)
    assert np.allclose(points.max(axis=0), hi, atol=2e-3 * region.radius)


def test_known_sector_bounds() -> None:
    quarter = Sector((0, 0), 2, (1, 0), math.pi / 4).bounds()
    assert quarter.lo == pytest.approx((0, -math.sqrt(2)))
    assert quarter.hi == pytest.approx((2, math.sqrt(2)))
    cone = Sector((1, 1, 1), 1, (0, 0, 5), math.pi / 2).bounds()
    assert cone.lo == pytest.approx((0, 0, 1))
    assert cone.hi == pytest.approx((2, 2, 2))
    assert Sector((0, 0, 0), 1, (1, 0, 0), math.pi).bounds() == Box((-1, -1, -1), (1, 1, 1))


def test_sector_bounds_next_to_an_axis_keep_every_digit() -> None:
    """A direction a hair off an axis: the angle to it is computed without cancellation,
    so the box reaches the sector's edge to the last bits (it was 2e-9 short)."""
    sector = Sector((0, 0), 1, (1.0, 2e-9), 2.0)
    assert sector.bounds().lo[0] == pytest.approx(math.cos(2.0 + 2e-9), abs=1e-15)


def test_sector_direction_is_stored_as_a_unit_vector() -> None:
    assert Sector((0, 0), 1, (3, 4), 1.0).direction == pytest.approx((0.6, 0.8))
    assert Sector((0, 0), 1, (1e300, 1e300), 1.0).direction == pytest.approx(
        (math.sqrt(0.5), math.sqrt(0.5))
    )


def test_boundaries_are_inside() -> None:
    assert Box((0, 0), (1, 1)).contains(np.array([[0, 0], [1, 1], [1, 0.5]])).all()
    assert Sphere((0, 0, 0), 2).contains(np.array([[2.0, 0, 0], [0, 0, -2.0]])).all()
    sector = Sector((0, 0), 1, (1, 0), math.pi / 2)
    assert sector.contains(np.array([[0, 0], [0, 1], [1, 0], [0, -1]])).all()
    assert not sector.contains(np.array([[-0.01, 0.5]])).any()


def test_contains_takes_50000_points_in_one_call() -> None:
    points = np.random.default_rng(1).uniform(-10, 10, size=(50_000, 3))
    for region in (
        Box((-5, -5, -5), (5, 5, 5)),
        Sphere((0, 0, 0), 5),
        Sector((0, 0, 0), 8, (1, 1, 0), 0.5),
    ):
        inside = region.contains(points)
        assert inside.shape == (50_000,)
        assert 0 < inside.sum() < 50_000


def test_contains_refuses_points_of_the_wrong_shape() -> None:
    with pytest.raises(IntermediaryError, match=r"points: expected shape \(N, 3\)"):
        Sphere((0, 0, 0), 1).contains(np.zeros((4, 2)))
    with pytest.raises(IntermediaryError, match="points"):
        Box((0, 0), (1, 1)).contains(np.zeros(2))


def test_nan_points_are_outside() -> None:
    points = np.array([[np.nan, 0.0], [0.0, 0.0]])
    for region in (Box((-1, -1), (1, 1)), Sphere((0, 0), 1), Sector((0, 0), 1, (1, 0), 1)):
        assert region.contains(points).tolist() == [False, True]


# -- translation and relative regions ([72]) -----------------------------------------------


@SETTINGS
@given(region=regions, seed=st.integers(0, 2**32 - 1))
def test_translation_moves_membership(region, seed: int) -> None:
    rng = np.random.default_rng(seed)
    offset = rng.uniform(-100, 100, region.dim)
    moved = region.translated(offset)
    assert type(moved) is type(region)
    points = around(region, rng)
    assert (moved.contains(points + offset) == region.contains(points)).mean() > 0.99


def _validated(region: Box | Sphere | Sector) -> Box | Sphere | Sector:
    """``region`` rebuilt through its validating constructor."""
    return type(region)(**{name: getattr(region, name) for name in region.__dataclass_fields__})


@SETTINGS
@given(region=regions, seed=st.integers(0, 2**32 - 1))
def test_a_shifted_region_is_the_validated_translation(region, seed: int) -> None:
    # shifted() skips re-validating what a translation keeps: it must build exactly the
    # region the validating constructor builds from the same numbers.
    offset = tuple(np.random.default_rng(seed).uniform(-1e6, 1e6, region.dim).tolist())
    moved = region.shifted(offset)
    assert moved == _validated(moved) == region.translated(offset)
    assert moved.bounds() == _validated(moved).bounds()


def test_a_shift_is_refused_where_a_translation_would_be() -> None:
    with pytest.raises(IntermediaryError, match=r"sphere: reaches .* beyond the largest"):
        Relative(Sphere((0, 0), 1), 7).resolve((MAX_EXTENT, 0.0))
    with pytest.raises(IntermediaryError, match=r"sector: reaches .* beyond the largest"):
        Relative(Sector((0, 0), 1, (1, 0), 1), 7).resolve((0.0, -MAX_EXTENT))
    # Far from the origin a very thin box rounds to no width: refused, naming the axis.
    with pytest.raises(IntermediaryError, match=r"box\.hi\[0\]: must be greater"):
        Box((0, 0), (1e-9, 1)).shifted((1e8, 0.0))


def test_relative_regions_resolve_at_the_entity_position() -> None:
    relative = parse_region({"sphere": {"radius": 5}, "relative_to": "ship-7", "dim": 3})
    assert relative == Relative(Sphere((0, 0, 0), 5), "ship-7")
    assert relative.resolve(np.array([10.0, 0, 0])) == Sphere((10, 0, 0), 5)
    ahead = parse_region(
        {"sector": {"radius": 3, "direction": [1, 0], "half_angle": 0.5}, "relative_to": 42}
    )
    assert ahead.resolve([1, 1]) == Sector((1, 1), 3, (1, 0), 0.5)
    window = parse_region({"box": {"lo": [-1, -1], "hi": [1, 1]}, "relative_to": "me"})
    assert window.resolve([5, 5]) == Box((4, 4), (6, 6))


@pytest.mark.parametrize(
    ("position", "message"),
    [
        ([1.0, float("nan"), 0.0], r"position of entity 'e'\[1\]: must be finite"),
        ([1.0, 2.0], "expected 3 coordinates"),
        ([MAX_EXTENT, 0, 0], "beyond the largest allowed extent"),
    ],
)
def test_a_bad_entity_position_is_refused(position, message: str) -> None:
    with pytest.raises(IntermediaryError, match=message):
        Relative(Sphere((0, 0, 0), 1), "e").resolve(position)


# -- the wire form -------------------------------------------------------------------------


@SETTINGS
@given(region=regions, relative=st.one_of(st.none(), st.text(min_size=1, max_size=20)))
def test_dump_and_parse_round_trip(region, relative: str | None) -> None:
    subscription = region if relative is None else Relative(region, relative)
    assert parse_region(dump_region(subscription)) == subscription


# -- (e) bad input is refused, naming the field --------------------------------------------

NAN, INF = float("nan"), float("inf")
BAD = [
    ({"box": {"lo": [0, NAN], "hi": [1, 1]}}, r"box\.lo\[1\]: must be finite"),
    ({"box": {"lo": [0, 0], "hi": [1, INF]}}, r"box\.hi\[1\]: must be finite"),
    ({"box": {"lo": [0, 0], "hi": [1, 1, 1]}}, r"box\.hi: expected 2 coordinates"),
    ({"box": {"lo": [0], "hi": [1]}}, r"box\.lo: expected 2 or 3 coordinates"),
    ({"box": {"lo": [0, 0, 0, 0], "hi": [1, 1, 1, 1]}}, r"box\.lo: expected 2 or 3"),
    ({"box": {"lo": [0, 0], "hi": [1, 0]}}, r"box\.hi\[1\]: must be greater"),
    ({"box": {"lo": [0, 5], "hi": [1, 2]}}, r"box\.hi\[1\]: must be greater"),
    ({"box": {"lo": [-2e9, 0], "hi": [1, 1]}}, r"box: reaches .* beyond the largest"),
    ({"box": {"lo": [0, 0], "hi": ["1", 1]}}, r"box\.hi\[0\]: expected a number"),
    ({"box": {"lo": [True, 0], "hi": [1, 1]}}, r"box\.lo\[0\]: expected a number"),
    ({"box": {"lo": [10**400, 0], "hi": [1, 1]}}, r"box\.lo\[0\]: .* too large"),
    ({"box": {"lo": "00", "hi": [1, 1]}}, r"box\.lo: expected a list"),
    ({"box": {"lo": [0, 0]}}, r"box\.hi: missing"),
    ({"box": {"lo": [0, 0], "hi": [1, 1], "size": 3}}, r"box\.size: unknown field"),
    ({"sphere": {"center": [0, 0], "radius": 0}}, r"sphere\.radius: must be positive"),
    ({"sphere": {"center": [0, 0], "radius": -1}}, r"sphere\.radius: must be positive"),
    ({"sphere": {"center": [0, 0], "radius": NAN}}, r"sphere\.radius: must be finite"),
    ({"sphere": {"center": [0, 0], "radius": 5e9}}, r"sphere: reaches .* beyond the largest"),
    ({"sphere": {"center": [9.9e8, 0, 0], "radius": 2e7}}, r"sphere: reaches .* on axis 0"),
    ({"sphere": {"center": [0, NAN, 0], "radius": 1}}, r"sphere\.center\[1\]: must be finite"),
    ({"sphere": {"radius": 1}}, r"sphere\.center: missing"),
    (
        {"sector": {"center": [0, 0], "radius": 1, "direction": [1, 0], "half_angle": 0}},
        r"sector\.half_angle: must be in \(0, pi\]",
    ),
    (
        {"sector": {"center": [0, 0], "radius": 1, "direction": [1, 0], "half_angle": -0.5}},
        r"sector\.half_angle: must be in \(0, pi\]",
    ),
    (
        {"sector": {"center": [0, 0], "radius": 1, "direction": [1, 0], "half_angle": 3.2}},
        r"sector\.half_angle: must be in \(0, pi\]",
    ),
    (
        {"sector": {"center": [0, 0], "radius": 1, "direction": [1, 0], "half_angle": NAN}},
        r"sector\.half_angle: must be finite",
    ),
    (
        {"sector": {"center": [0, 0], "radius": 1, "direction": [0, 0], "half_angle": 1}},
        r"sector\.direction: must not be the zero vector",
    ),
    (
        {"sector": {"center": [0, 0], "radius": 1, "direction": [1, 0, 0], "half_angle": 1}},
        r"sector\.direction: expected 2 coordinates",
    ),
    (
        {"sector": {"center": [0, 0], "radius": 0, "direction": [1, 0], "half_angle": 1}},
        r"sector\.radius: must be positive",
    ),
    ({"sector": {"center": [0, 0], "radius": 1, "half_angle": 1}}, r"sector\.direction: missing"),
    ({"cylinder": {"center": [0, 0], "radius": 1}}, r"region: unknown key 'cylinder'"),
    ({}, r"region: expected exactly one of box, sphere, sector, got 0"),
    (
        {"box": {"lo": [0, 0], "hi": [1, 1]}, "sphere": {"center": [0, 0], "radius": 1}},
        r"region: expected exactly one of box, sphere, sector, got 2",
    ),
    ([1, 2], r"region: expected an object"),
    ({"box": [0, 0, 1, 1]}, r"box: expected an object"),
    ({"sphere": {"radius": 1}, "relative_to": "me"}, r"sphere\.center: missing; a relative"),
    ({"sphere": {"radius": 1}, "relative_to": "me", "dim": 4}, r"dim: expected 2 or 3"),
    ({"sphere": {"center": [0, 0], "radius": 1}, "dim": 3}, r"dim: says 3, but the sphere has 2"),
    ({"box": {"lo": [0, 0], "hi": [1, 1]}, "relative_to": ""}, r"relative_to: an entity id"),
    ({"box": {"lo": [0, 0], "hi": [1, 1]}, "relative_to": "x" * 300}, r"relative_to: an entity"),
    ({"box": {"lo": [0, 0], "hi": [1, 1]}, "relative_to": 1.5}, r"relative_to: expected an entity"),
    (
        {"box": {"lo": [0, 0], "hi": [1, 1]}, "relative_to": None},
        r"relative_to: expected an entity",
    ),
]


@pytest.mark.parametrize(("spec", "message"), BAD)
def test_bad_regions_are_refused_naming_the_field(spec, message: str) -> None:
    with pytest.raises(IntermediaryError, match=message):
        parse_region(spec)


def test_constructors_validate_too() -> None:
    with pytest.raises(IntermediaryError, match=r"sphere\.radius: must be positive"):
        Sphere((0, 0), 0)
    with pytest.raises(IntermediaryError, match=r"box\.hi: expected 3 coordinates"):
        Box((0, 0, 0), (1, 1))
    with pytest.raises(IntermediaryError, match=r"sector\.center\[0\]: must be finite"):
        Sector((INF, 0), 1, (1, 0), 1)
    with pytest.raises(IntermediaryError, match="beyond the largest allowed extent"):
        Box((0, 0), (1, 1)).translated((MAX_EXTENT, 0))
    with pytest.raises(IntermediaryError, match=r"offset: expected 2 coordinates"):
        Sphere((0, 0), 1).translated((1, 1, 1))


def test_regions_are_frozen_and_hashable() -> None:
    box = Box([0, 0], np.array([1.0, 2.0]))
    assert box == Box((0.0, 0.0), (1.0, 2.0))
    assert len({box, Box((0, 0), (1, 2))}) == 1
    with pytest.raises(AttributeError):
        box.lo = (1, 1)  # type: ignore[misc]
