"""Spatial subscription regions: boxes, spheres and sectors in 2D and 3D ([68]-[72], [155]).

A subscriber asks for what lies in a region of space: an axis-aligned box (its corners), a
sphere (a position and a radius; a circle in 2D) or a sector (a position, a radius, a
direction and a half angle: a circular sector in 2D, a spherical cone sector in 3D). The
intermediary tests tens of thousands of entity positions against each region every epoch,
so :meth:`contains` takes an ``(N, dim)`` array and answers with one vectorised numpy pass,
never a Python loop per point.

Regions arrive from the network, so they are validated where they are built: every
coordinate finite, dimension 2 or 3 and the same in every field, sizes positive, angles in
range, and the whole region inside the cube ``[-MAX_EXTENT, MAX_EXTENT]^dim`` (a region of
absurd size is refused rather than letting it pull the whole world upstream). A refusal is an
:class:`~tidings.errors.IntermediaryError` whose message starts with the offending field
(``sphere.radius: ...``), so the subscriber learns what to fix.

Regions are closed sets: a point on the boundary is inside. ``contains`` also checks the
point against :meth:`bounds`, so "contained" always implies "inside the bounding box", even at
the last bit of floating-point rounding -- coverage relies on that.

A subscription may be relative to the subscriber's own entity ([72]): :class:`Relative` keeps
the region in the entity's frame (offsets from its position) and :meth:`Relative.resolve`
places it at the position the state store holds. Only translation is applied: a sector's
direction stays in world axes (entities carry no orientation in the state the patent
describes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import numpy as np

from tidings.errors import IntermediaryError

#: No coordinate of a region (its bounding box) may lie beyond this, in either direction.
MAX_EXTENT = 1e9
#: The longest entity id a relative subscription may name.
MAX_ENTITY_ID_LENGTH = 256

Vector: TypeAlias = tuple[float, ...]
_R = TypeVar("_R")


def _vector(field: str, value: object, dim: int | None = None) -> Vector:
    """``value`` as a tuple of finite floats of length 2 or 3 (or ``dim``), or a refusal
    naming ``field``."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise IntermediaryError(
                f"{field}: expected a vector, got an array of shape {value.shape}"
            )
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise IntermediaryError(f"{field}: expected a list of 2 or 3 numbers, got {value!r:.80}")
    if len(value) not in (2, 3):
        raise IntermediaryError(f"{field}: expected 2 or 3 coordinates, got {len(value)}")
    if dim is not None and len(value) != dim:
        raise IntermediaryError(
            f"{field}: expected {dim} coordinates (as the other fields), got {len(value)}"
        )
    return tuple(_number(f"{field}[{i}]", x) for i, x in enumerate(value))


def _number(field: str, value: object) -> float:
    """``value`` as a finite float, or a refusal naming ``field`` (a bool is not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise IntermediaryError(f"{field}: expected a number, got {value!r:.80}")
    try:
        number = float(value)
    except OverflowError:
        raise IntermediaryError(f"{field}: {value!r:.40} is too large") from None
    if not math.isfinite(number):
        raise IntermediaryError(f"{field}: must be finite, got {number}")
    return number


def _within_extent(
    kind: str, lo: Sequence[float] | np.ndarray, hi: Sequence[float] | np.ndarray
) -> None:
    """Refuse a region whose bounding box reaches beyond ``MAX_EXTENT``. (Plain Python on a
    few numbers: regions are built per subscriber per epoch, and numpy's per-call cost would
    dominate.)"""
    for axis, (a, b) in enumerate(zip(lo, hi, strict=True)):
        if a < -MAX_EXTENT or b > MAX_EXTENT:
            raise IntermediaryError(
                f"{kind}: reaches [{a:g}, {b:g}] on axis {axis}, beyond the "
                f"largest allowed extent ±{MAX_EXTENT:g}"
            )


def _points(points: object, dim: int) -> np.ndarray:
    """``points`` as a float ``(N, dim)`` array, or a refusal saying what shape was given."""
    array = np.asarray(points, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] != dim:
        raise IntermediaryError(f"points: expected shape (N, {dim}), got {array.shape}")
    return array


def _in_box(
    points: np.ndarray, lo: Sequence[float] | np.ndarray, hi: Sequence[float] | np.ndarray
) -> np.ndarray:
    """``lo <= p <= hi`` on every axis, a column at a time (a reduction along rows of 2 or 3
    costs several times more on the few hundred points of a view)."""
    inside = (points[:, 0] >= lo[0]) & (points[:, 0] <= hi[0])
    for axis in range(1, points.shape[1]):
        column = points[:, axis]
        inside &= (column >= lo[axis]) & (column <= hi[axis])
    return inside


@dataclass(frozen=True)
class Box:
    """An axis-aligned box, closed: ``lo <= p <= hi`` on every axis, with ``lo < hi``.

    It is also the unit of upstream subscriptions (:mod:`.coverage`): what a publisher
    indexes cheaply.
    """

    lo: Vector
    hi: Vector

    def __post_init__(self) -> None:
        lo = _vector("box.lo", self.lo)
        hi = _vector("box.hi", self.hi, len(lo))
        for axis, (a, b) in enumerate(zip(lo, hi, strict=True)):
            if not a < b:
                raise IntermediaryError(
                    f"box.hi[{axis}]: must be greater than box.lo[{axis}] ({b:g} <= {a:g}); "
                    "a box must have a positive size on every axis"
                )
        _within_extent("box", lo, hi)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    @property
    def dim(self) -> int:
        return len(self.lo)

    def bounds(self) -> Box:
        return self

    def contains(self, points: np.ndarray) -> np.ndarray:
        """Which of the ``(N, dim)`` points lie in the box (boundary included)."""
        array = _points(points, self.dim)
        return _in_box(array, self.lo, self.hi)

    def translated(self, offset: Sequence[float] | np.ndarray) -> Box:
        return self.shifted(_vector("offset", offset, self.dim))

    def shifted(self, shift: Vector) -> Box:
        """:meth:`translated` by an offset already validated (finite floats, this
        dimension): only what a translation can break is checked again (the extent, and
        a positive size, which rounding can lose far from the origin)."""
        lo = tuple(a + d for a, d in zip(self.lo, shift, strict=True))
        hi = tuple(b + d for b, d in zip(self.hi, shift, strict=True))
        if not all(a < b for a, b in zip(lo, hi, strict=True)):
            return Box(lo, hi)  # the validating constructor names the flat axis
        _within_extent("box", lo, hi)
        return _trusted(Box, lo=lo, hi=hi)

    def volume(self) -> float:
        """Area in 2D, volume in 3D."""
        return float(np.prod(np.array(self.hi) - np.array(self.lo)))


def _trusted(cls: type[_R], **fields: object) -> _R:
    """A region of ``fields`` known valid (computed from a validated region), built without
    validating again: validation costs more than the rest of a view's selection, per view,
    and most of placing a relative region."""
    region = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(region, name, value)
    return region


def _derived_box(lo: Vector, hi: Vector) -> Box:
    """A box computed from a region that was validated already (its bounds)."""
    return _trusted(Box, lo=lo, hi=hi)


@dataclass(frozen=True)
class Sphere:
    """All points within ``radius`` of ``center`` (a disc in 2D), boundary included."""

    center: Vector
    radius: float

    def __post_init__(self) -> None:
        center = _vector("sphere.center", self.center)
        radius = _number("sphere.radius", self.radius)
        if radius <= 0:
            raise IntermediaryError(f"sphere.radius: must be positive, got {radius:g}")
        _within_extent("sphere", [x - radius for x in center], [x + radius for x in center])
        object.__setattr__(self, "center", center)
        object.__setattr__(self, "radius", radius)

    @property
    def dim(self) -> int:
        return len(self.center)

    def bounds(self) -> Box:
        r = self.radius
        return _derived_box(tuple(x - r for x in self.center), tuple(x + r for x in self.center))

    def contains(self, points: np.ndarray) -> np.ndarray:
        array = _points(points, self.dim)
        center = np.array(self.center)
        offsets = array - center
        squared: np.ndarray = np.einsum("ij,ij->i", offsets, offsets)
        inside: np.ndarray = squared <= self.radius * self.radius
        # The bounding-box test on the same numbers bounds() gives (see the module doc).
        r = self.radius
        inside &= _in_box(array, [x - r for x in self.center], [x + r for x in self.center])
        return inside

    def translated(self, offset: Sequence[float] | np.ndarray) -> Sphere:
        return self.shifted(_vector("offset", offset, self.dim))

    def shifted(self, shift: Vector) -> Sphere:
        """:meth:`translated` by an offset already validated; only the extent is checked."""
        center = tuple(c + d for c, d in zip(self.center, shift, strict=True))
        r = self.radius
        _within_extent("sphere", [x - r for x in center], [x + r for x in center])
        return _trusted(Sphere, center=center, radius=r)


def _unit(field: str, direction: Vector) -> Vector:
    """``direction`` scaled to length 1 (scaled down first, so huge entries do not overflow).

    A vector already of length 1 to rounding is kept bit for bit, so that a sector read back
    from its wire form (:func:`dump_region`) is equal to the one written.
    """
    d = np.array(direction)
    largest = float(np.max(np.abs(d)))
    if largest == 0.0:
        raise IntermediaryError(f"{field}: must not be the zero vector")
    if largest <= 1.0 and abs(float(np.linalg.norm(d)) - 1.0) <= 4 * np.finfo(float).eps:
        return direction
    d = d / largest
    return tuple((d / np.linalg.norm(d)).tolist())


@dataclass(frozen=True)
class Sector:
    """The points within ``radius`` of ``center`` whose direction from it is at most
    ``half_angle`` (radians, in (0, pi]) from ``direction``: a circular sector in 2D, a
    spherical cone sector in 3D. The center itself is inside. ``direction`` is stored as a
    unit vector; ``half_angle`` = pi is the whole disc or ball.
    """

    center: Vector
    radius: float
    direction: Vector
    half_angle: float

    def __post_init__(self) -> None:
        center = _vector("sector.center", self.center)
        radius = _number("sector.radius", self.radius)
        direction = _unit(
            "sector.direction", _vector("sector.direction", self.direction, len(center))
        )
        half_angle = _number("sector.half_angle", self.half_angle)
        if radius <= 0:
            raise IntermediaryError(f"sector.radius: must be positive, got {radius:g}")
        if not 0 < half_angle <= math.pi:
            raise IntermediaryError(
                f"sector.half_angle: must be in (0, pi] radians, got {half_angle:g}"
            )
        c = np.array(center)
        _within_extent("sector", c - radius, c + radius)
        object.__setattr__(self, "center", center)
        object.__setattr__(self, "radius", radius)
        object.__setattr__(self, "direction", direction)
        object.__setattr__(self, "half_angle", half_angle)

    @property
    def dim(self) -> int:
        return len(self.center)

    def bounds(self) -> Box:
        """The tight bounding box.

        Along an axis direction ``e`` the sector reaches ``r * cos(max(0, theta - alpha))``
        (never less than 0: the apex is inside), where ``theta`` is the angle between ``e``
        and the direction: the closest direction of the cone to ``e`` is ``theta - alpha``
        away from it, in 2D and in 3D alike.
        """
        u = np.array(self.direction)
        c = np.array(self.center)
        # atan2, not arccos: arccos loses half the digits next to an axis (u_i near 1).
        square = u * u
        across = np.sqrt([np.delete(square, axis).sum() for axis in range(self.dim)])
        theta_plus = np.arctan2(across, u)
        theta_minus = np.arctan2(across, -u)
        reach_plus = self.radius * np.maximum(
            0.0, np.cos(np.maximum(0.0, theta_plus - self.half_angle))
        )
        reach_minus = self.radius * np.maximum(
            0.0, np.cos(np.maximum(0.0, theta_minus - self.half_angle))
        )
        lo = c - reach_minus
        hi = c + reach_plus
        # A very thin sector may round to no width on an axis: widen by one step, outwards.
        flat = hi <= lo
        hi = np.where(flat, np.nextafter(hi, np.inf), hi)
        lo = np.where(flat, np.nextafter(lo, -np.inf), lo)
        return Box(tuple(lo.tolist()), tuple(hi.tolist()))

    def contains(self, points: np.ndarray) -> np.ndarray:
        array = _points(points, self.dim)
        box = self.bounds()
        offsets = array - np.array(self.center)
        squared = np.einsum("ij,ij->i", offsets, offsets)
        inside: np.ndarray = (squared <= self.radius * self.radius) & _in_box(
            array, np.array(box.lo), np.array(box.hi)
        )
        if self.half_angle < math.pi:
            along = offsets @ np.array(self.direction)
            # Half a dozen units of rounding of slack: a point on the cone's surface (e.g. on
            # the edge of a half plane, where cos(pi/2) rounds to 6e-17) is inside.
            length = np.sqrt(squared)
            inside &= along >= length * (math.cos(self.half_angle) - 8 * np.finfo(float).eps)
        return inside

    def translated(self, offset: Sequence[float] | np.ndarray) -> Sector:
        return self.shifted(_vector("offset", offset, self.dim))

    def shifted(self, shift: Vector) -> Sector:
        """:meth:`translated` by an offset already validated; only the extent is checked
        (the direction, radius and angle are this sector's, valid already)."""
        center = tuple(c + d for c, d in zip(self.center, shift, strict=True))
        r = self.radius
        _within_extent("sector", [x - r for x in center], [x + r for x in center])
        return _trusted(
            Sector,
            center=center,
            radius=r,
            direction=self.direction,
            half_angle=self.half_angle,
        )


Region: TypeAlias = Box | Sphere | Sector


@dataclass(frozen=True)
class Relative:
    """A region in the frame of the subscriber's own entity ([72]): ``region``'s coordinates
    are offsets from that entity's position, which the state store holds."""

    region: Region
    entity_id: str | int

    def __post_init__(self) -> None:
        entity = self.entity_id
        if isinstance(entity, bool) or not isinstance(entity, (str, int)):
            raise IntermediaryError(
                f"relative_to: expected an entity id (text or integer), got {entity!r:.80}"
            )
        if isinstance(entity, str) and not 0 < len(entity) <= MAX_ENTITY_ID_LENGTH:
            raise IntermediaryError(
                f"relative_to: an entity id has 1 to {MAX_ENTITY_ID_LENGTH} characters, "
                f"got {len(entity)}"
            )

    @property
    def dim(self) -> int:
        return self.region.dim

    def resolve(self, position: Sequence[float] | np.ndarray) -> Region:
        """The region placed at the entity's ``position``; refused (naming the position) if it
        is not finite, has the wrong dimension, or moves the region beyond ``MAX_EXTENT``."""
        offset = _vector(f"position of entity {self.entity_id!r}", position, self.dim)
        return self.region.shifted(offset)


Subscription: TypeAlias = Region | Relative

_FIELDS = {
    "box": ("lo", "hi"),
    "sphere": ("center", "radius"),
    "sector": ("center", "radius", "direction", "half_angle"),
}


def parse_region(spec: object) -> Subscription:
    """A region from what a subscriber sends, e.g. ``{"sphere": {"center": [0, 0, 0],
    "radius": 5}}``, ``{"box": {"lo": [..], "hi": [..]}}`` or ``{"sector": {"center": [..],
    "radius": r, "direction": [..], "half_angle": a}}`` (radians), with an optional
    ``"relative_to": <entity id>``.

    A relative sphere or sector may leave out its center (it defaults to the entity's own
    position, the patent's "within a given radius of its current position"); a sphere then
    needs ``"dim": 2`` or ``3`` beside it. Unknown keys are refused, so a typo is not silently
    ignored.
    """
    if not isinstance(spec, Mapping):
        raise IntermediaryError(f"region: expected an object, got {type(spec).__name__}")
    kinds = [key for key in spec if key in _FIELDS]
    unknown = sorted(
        str(key) for key in spec if key not in _FIELDS and key not in ("relative_to", "dim")
    )
    if unknown:
        raise IntermediaryError(
            f"region: unknown key {unknown[0]!r} (a region is one of box, sphere, sector, "
            "with optional relative_to and dim)"
        )
    if len(kinds) != 1:
        raise IntermediaryError(
            f"region: expected exactly one of box, sphere, sector, got {len(kinds)}"
        )
    kind = kinds[0]
    fields = spec[kind]
    if not isinstance(fields, Mapping):
        raise IntermediaryError(f"{kind}: expected an object, got {type(fields).__name__}")
    extra = sorted(str(key) for key in fields if key not in _FIELDS[kind])
    if extra:
        raise IntermediaryError(
            f"{kind}.{extra[0]}: unknown field (expected {', '.join(_FIELDS[kind])})"
        )
    relative = "relative_to" in spec
    dim = check_dim(spec.get("dim")) if "dim" in spec else None
    values: dict[str, Any] = dict(fields)
    if relative and kind != "box" and "center" not in values:
        if dim is None and kind == "sector" and isinstance(values.get("direction"), Sequence):
            dim = len(values["direction"])
        if dim not in (2, 3):
            raise IntermediaryError(
                f"{kind}.center: missing; a relative {kind} without a center needs 'dim' (2 or 3)"
            )
        values["center"] = (0.0,) * dim
    for name in _FIELDS[kind]:
        if name not in values:
            raise IntermediaryError(f"{kind}.{name}: missing")
    region: Region
    if kind == "box":
        region = Box(values["lo"], values["hi"])
    elif kind == "sphere":
        region = Sphere(values["center"], values["radius"])
    else:
        region = Sector(
            values["center"], values["radius"], values["direction"], values["half_angle"]
        )
    if dim is not None and region.dim != dim:
        raise IntermediaryError(f"dim: says {dim}, but the {kind} has {region.dim} coordinates")
    if relative:
        return Relative(region, spec["relative_to"])
    return region


def check_dim(value: object) -> int:
    """``value`` as a dimension, 2 or 3; anything else is refused naming ``dim``."""
    if isinstance(value, bool) or value not in (2, 3):
        raise IntermediaryError(f"dim: expected 2 or 3, got {value!r:.40}")
    return 2 if value == 2 else 3


def dump_region(subscription: Subscription) -> dict[str, Any]:
    """The wire form :func:`parse_region` reads back (e.g. to hand a subscription over to
    another intermediary)."""
    if isinstance(subscription, Relative):
        return {**dump_region(subscription.region), "relative_to": subscription.entity_id}
    if isinstance(subscription, Box):
        return {"box": {"lo": list(subscription.lo), "hi": list(subscription.hi)}}
    if isinstance(subscription, Sphere):
        return {"sphere": {"center": list(subscription.center), "radius": subscription.radius}}
    return {
        "sector": {
            "center": list(subscription.center),
            "radius": subscription.radius,
            "direction": list(subscription.direction),
            "half_angle": subscription.half_angle,
        }
    }
