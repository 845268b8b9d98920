"""Coverage: do the intermediary's upstream subscriptions cover a subscriber's region, and
what must it subscribe to when they do not (claims 1-3, [78]-[83], [155]).

The intermediary's own (upstream) subscriptions are axis-aligned boxes, whatever shape its
subscribers ask for: a box is what a publisher indexes cheaply (a grid or an R-tree answers
"which entities are in this box" without geometry), it is exact to reason about, and a set
of boxes stays a set of boxes under union and difference. A sphere or sector subscription is
served from the boxes that cover it.

How coverage is decided: the region's bounding box is cut on every upstream boundary that
falls inside it (coordinate compression). Every cell of that grid lies wholly inside or
wholly outside each upstream box, so "is this cell covered" is exact, and the union covers a
box region iff every cell is covered. For a sphere or a sector only the cells that touch the
region matter; the touch test is exact for a sphere (distance from the center to the cell)
and conservative for a sector (the ball test, and the cone against the cell's circumscribed
ball), always with a small tolerance outwards. So :func:`covers` is exact on boxes and
conservative on spheres and sectors: it may answer "not covered" for a region that is
covered (a cell that only grazes a sector's cone), never "covered" for one that is not. The
same grid works in 2D and 3D, so shapely (2D only, polygonal circles) is not needed here.
A grid too large for one pass (``MAX_GRID_CELLS``) is halved at a boundary and each half
answered alone, so a large upstream set costs time, not a refusal.

What is subscribed upstream is set by an :class:`UpstreamPolicy` (claim 2): ``exact``
subscribes to just the uncovered pieces, ``bounding`` keeps one box around everything
([83], [155]), ``margin`` grows the uncovered pieces by a distance (the "neighbourhood" of
claim 2, so that a subscriber moving a little stays covered), never beyond a world box if one
is given. :func:`add` is the subscribe path (subscribe only for what is not covered, claim
1); :func:`plan` recomputes the whole upstream set from the live subscriptions, which is how
it shrinks on unsubscribe.

The number of upstream boxes is bounded (``max_boxes``): past it, the two boxes whose
bounding box wastes the least volume are merged, until the count fits. A merged box may then
overlap others and reach beyond the live regions -- but never beyond the bounding box of
them (grown by the margin): the upstream set trades a little extra data for a bounded number
of subscriptions the publisher must index.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tidings.errors import IntermediaryError
from tidings.intermediary.regions.geometry import MAX_EXTENT, Box, Region, Relative, Sector, Sphere

#: The default bound on the number of upstream boxes an intermediary holds.
MAX_UPSTREAM_BOXES = 64
#: The largest compressed grid built in one pass (cells); a larger one is halved first. 64
#: upstream boxes cut a 3D region into at most 130^3 = 2.2 million cells: one pass.
MAX_GRID_CELLS = 4_000_000
#: How many times a grid too large for one pass may be halved before coverage gives up.
_MAX_SPLITS = 48
#: Relative slack of the touch tests: a cell within this of a sphere or sector counts as
#: touching it, so rounding can only make coverage more conservative.
_TOUCH_SLACK = 1e-9


@dataclass(frozen=True)
class UpstreamPolicy:
    """What the intermediary subscribes to when a region is not covered (claim 2).

    Build it with :meth:`exact`, :meth:`bounding` or :meth:`margin`. ``max_boxes`` bounds the
    upstream set (:mod:`coverage` says how it is kept under it).
    """

    kind: Literal["exact", "bounding", "margin"] = "exact"
    distance: float = 0.0
    max_boxes: int = MAX_UPSTREAM_BOXES

    def __post_init__(self) -> None:
        if self.kind not in ("exact", "bounding", "margin"):
            raise IntermediaryError(
                f"policy: unknown kind {self.kind!r} (exact, bounding or margin)"
            )
        distance = self.distance
        if isinstance(distance, bool) or not isinstance(distance, (int, float)):
            raise IntermediaryError(f"policy.distance: expected a number, got {distance!r:.40}")
        if not (math.isfinite(distance) and 0 <= distance <= MAX_EXTENT):
            raise IntermediaryError(
                f"policy.distance: must be in [0, {MAX_EXTENT:g}], got {distance}"
            )
        if isinstance(self.max_boxes, bool) or not isinstance(self.max_boxes, int):
            raise IntermediaryError(
                f"policy.max_boxes: expected an integer, got {self.max_boxes!r}"
            )
        if self.max_boxes < 1:
            raise IntermediaryError(f"policy.max_boxes: must be at least 1, got {self.max_boxes}")
        object.__setattr__(self, "distance", float(distance))

    @classmethod
    def exact(cls, max_boxes: int = MAX_UPSTREAM_BOXES) -> UpstreamPolicy:
        """Subscribe to the uncovered pieces only."""
        return cls("exact", 0.0, max_boxes)

    @classmethod
    def bounding(cls) -> UpstreamPolicy:
        """One upstream box: the bounding box of everything subscribed ([83], [155])."""
        return cls("bounding", 0.0, 1)

    @classmethod
    def margin(cls, distance: float, max_boxes: int = MAX_UPSTREAM_BOXES) -> UpstreamPolicy:
        """The uncovered pieces grown by ``distance`` on every side (claim 2's neighbourhood)."""
        return cls("margin", distance, max_boxes)


# -- the compressed grid -------------------------------------------------------------------


def _check_dims(boxes: Iterable[Box], dim: int, field: str) -> list[Box]:
    boxes = list(boxes)
    for index, box in enumerate(boxes):
        if not isinstance(box, Box):
            raise IntermediaryError(f"{field}[{index}]: expected a Box, got {type(box).__name__}")
        if box.dim != dim:
            raise IntermediaryError(f"{field}[{index}]: has {box.dim} dimensions, expected {dim}")
    return boxes


def _check_region(region: object, field: str = "region") -> Region:
    if isinstance(region, Relative):
        raise IntermediaryError(
            f"{field}: a relative region is placed first (Relative.resolve at its entity's "
            "position); coverage is decided on where it is now"
        )
    if not isinstance(region, (Box, Sphere, Sector)):
        raise IntermediaryError(f"{field}: expected a region, got {type(region).__name__}")
    return region


def _overlapping(boxes: Sequence[Box], extent: Box) -> list[Box]:
    """The boxes that share a positive volume with ``extent`` (a box touching it only on a
    face covers none of it: the uncovered rest of a full-dimensional box has volume)."""
    if len(boxes) < 8:
        lo, hi = extent.lo, extent.hi
        return [
            b
            for b in boxes
            if all(x < y for x, y in zip(b.lo, hi, strict=True))
            and all(x > y for x, y in zip(b.hi, lo, strict=True))
        ]
    # One vectorised test for many boxes (an intermediary holds up to max_boxes of them).
    blo = np.array([b.lo for b in boxes])
    bhi = np.array([b.hi for b in boxes])
    hit = ((blo < np.array(extent.hi)) & (bhi > np.array(extent.lo))).all(axis=1)
    return [boxes[int(i)] for i in np.flatnonzero(hit)]


def _axes(extent: Box, boxes: Sequence[Box]) -> list[np.ndarray]:
    """Per axis, the sorted cut coordinates: the extent's ends and every box boundary inside."""
    axes = []
    for axis in range(extent.dim):
        lo, hi = extent.lo[axis], extent.hi[axis]
        cuts = [lo, hi]
        for box in boxes:
            cuts.extend(x for x in (box.lo[axis], box.hi[axis]) if lo < x < hi)
        axes.append(np.unique(np.array(cuts)))
    return axes


def _paint(axes: list[np.ndarray], boxes: Sequence[Box]) -> np.ndarray:
    """The cells inside some box. Each box's clipped boundaries are cut coordinates, so its
    cells are an index range per axis: one slice assignment per box."""
    grid = np.zeros(tuple(len(a) - 1 for a in axes), dtype=bool)
    for box in boxes:
        index = []
        for axis, cuts in enumerate(axes):
            lo = max(box.lo[axis], cuts[0])
            hi = min(box.hi[axis], cuts[-1])
            if not lo < hi:
                break
            index.append(slice(np.searchsorted(cuts, lo), np.searchsorted(cuts, hi)))
        else:
            grid[tuple(index)] = True
    return grid


def _cell_bounds(axes: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per axis, the cells' low and high ends, shaped to broadcast over the grid."""
    dim = len(axes)
    los, his = [], []
    for axis, cuts in enumerate(axes):
        shape = [1] * dim
        shape[axis] = len(cuts) - 1
        los.append(cuts[:-1].reshape(shape))
        his.append(cuts[1:].reshape(shape))
    return los, his


def touching(region: Region, axes: list[np.ndarray]) -> np.ndarray:
    """The cells (between the sorted ``axes`` cuts) that may share a point with ``region``
    (never misses one that does)."""
    shape = tuple(len(a) - 1 for a in axes)
    if isinstance(region, Box):
        return np.ones(shape, dtype=bool)
    los, his = _cell_bounds(axes)
    center = region.center
    slack = _TOUCH_SLACK * (region.radius + max(abs(x) for x in center) + 1.0)
    squared = np.zeros(shape)
    for axis, c in enumerate(center):
        squared = squared + (np.clip(c, los[axis], his[axis]) - c) ** 2
    touch = squared <= (region.radius + slack) ** 2
    if isinstance(region, Sector) and region.half_angle < math.pi:
        # The distance from the cell's middle to the (infinite) cone, against the radius of
        # the ball around the cell: conservative, since the cell lies in that ball.
        along = np.zeros(shape)
        length2 = np.zeros(shape)
        reach2 = np.zeros(shape)
        for axis, (c, u) in enumerate(zip(center, region.direction, strict=True)):
            w = (los[axis] + his[axis]) / 2 - c
            along = along + w * u
            length2 = length2 + w * w
            reach2 = reach2 + ((his[axis] - los[axis]) / 2) ** 2
        length = np.sqrt(length2)
        with np.errstate(invalid="ignore", divide="ignore"):
            cos_theta = np.where(length > 0, along / np.where(length > 0, length, 1.0), 1.0)
        off = np.arccos(np.clip(cos_theta, -1.0, 1.0)) - region.half_angle
        distance = np.where(
            off <= 0, 0.0, np.where(off >= math.pi / 2, length, length * np.sin(off))
        )
        touch &= distance <= np.sqrt(reach2) + slack
    return touch


def _to_boxes(axes: list[np.ndarray], mask: np.ndarray) -> list[Box]:
    """Disjoint boxes whose union is exactly the marked cells: from each first unclaimed
    cell, grow along the last axis, then the others in turn, while the slab is all marked."""
    remaining = mask.copy()
    dim = mask.ndim
    boxes = []
    for start in np.argwhere(mask):
        first = tuple(int(i) for i in start)
        if not remaining[first]:
            continue
        end = [i + 1 for i in first]
        for axis in reversed(range(dim)):
            while end[axis] < mask.shape[axis]:
                slab = tuple(
                    slice(end[k], end[k] + 1) if k == axis else slice(first[k], end[k])
                    for k in range(dim)
                )
                if not remaining[slab].all():
                    break
                end[axis] += 1
        remaining[tuple(slice(first[k], end[k]) for k in range(dim))] = False
        boxes.append(
            Box(
                tuple(float(axes[k][first[k]]) for k in range(dim)),
                tuple(float(axes[k][end[k]]) for k in range(dim)),
            )
        )
    return boxes


def _hull(boxes: Iterable[Box]) -> Box:
    boxes = list(boxes)
    lo = np.min([b.lo for b in boxes], axis=0)
    hi = np.max([b.hi for b in boxes], axis=0)
    return Box(tuple(lo.tolist()), tuple(hi.tolist()))


def _inside(inner: Box, outer: Box) -> bool:
    return all(a >= b for a, b in zip(inner.lo, outer.lo, strict=True)) and all(
        a <= b for a, b in zip(inner.hi, outer.hi, strict=True)
    )


# -- coverage ------------------------------------------------------------------------------


def _difference(
    extent: Box,
    wanted: Region | Sequence[Box],
    existing: Sequence[Box],
    first_only: bool = False,
    depth: int = 0,
) -> list[Box]:
    """Disjoint boxes inside ``extent`` holding every point of ``wanted`` (a region, or the
    union of boxes) that no ``existing`` box holds; with ``first_only``, stop at the first.

    A grid too large for one pass (many boundaries inside the extent) is split in two at
    the median boundary of its busiest axis, and each half answered alone: fewer boxes cut
    each half, and a box that holds a whole half settles it at once.
    """
    relevant = _overlapping(existing, extent)
    if any(_inside(extent, box) for box in relevant):
        return []
    parts = [] if isinstance(wanted, (Box, Sphere, Sector)) else _overlapping(wanted, extent)
    if not parts and not isinstance(wanted, (Box, Sphere, Sector)):
        return []
    axes = _axes(extent, [*relevant, *parts])
    if math.prod(len(a) - 1 for a in axes) > MAX_GRID_CELLS:
        if depth >= _MAX_SPLITS:
            raise IntermediaryError(
                f"upstream: {len(relevant)} boxes cut a region too finely to decide coverage; "
                "keep the upstream set small (UpstreamPolicy.max_boxes)"
            )
        axis = int(np.argmax([len(a) for a in axes]))
        cut = float(axes[axis][len(axes[axis]) // 2])
        lower = Box(extent.lo, tuple(cut if k == axis else x for k, x in enumerate(extent.hi)))
        upper = Box(tuple(cut if k == axis else x for k, x in enumerate(extent.lo)), extent.hi)
        pieces = _difference(lower, wanted, relevant, first_only, depth + 1)
        if first_only and pieces:
            return pieces
        return pieces + _difference(upper, wanted, relevant, first_only, depth + 1)
    if isinstance(wanted, (Box, Sphere, Sector)):
        mask = touching(wanted, axes) & ~_paint(axes, relevant)
    else:
        mask = _paint(axes, parts) & ~_paint(axes, relevant)
    if first_only:
        return [extent] if mask.any() else []
    return _to_boxes(axes, mask)


def covers(upstream: Sequence[Box], region: Region) -> bool:
    """Whether the union of the ``upstream`` boxes covers ``region`` ([78], [155]).

    Exact for a box; conservative for a sphere or a sector (it may say False for a region
    that is covered, never True for one that is not).
    """
    region = _check_region(region)
    upstream = _check_dims(upstream, region.dim, "upstream")
    return not _difference(region.bounds(), region, upstream, first_only=True)


def uncovered(upstream: Sequence[Box], region: Region) -> list[Box]:
    """Disjoint boxes, inside the region's bounding box, whose union contains every point of
    ``region`` outside the upstream boxes; empty iff :func:`covers` says covered.

    For a box that is exactly the difference. For a sphere or a sector it is the uncovered
    part of the bounding box that touches the region (so a sphere's corners that lie outside
    it are not asked for).
    """
    region = _check_region(region)
    upstream = _check_dims(upstream, region.dim, "upstream")
    return _difference(region.bounds(), region, upstream)


def _subtract(wanted: Sequence[Box], existing: Sequence[Box]) -> list[Box]:
    """Disjoint boxes whose union is the union of ``wanted`` minus the union of ``existing``."""
    return _difference(_hull(wanted), wanted, existing)


def _grown(box: Box, distance: float, world: Box | None) -> list[Box]:
    """``box`` and its neighbourhood: grown by ``distance`` on every side, the growth cut at
    the world's edge. The box itself is kept whole even where it reaches outside the world
    (a subscriber may ask for that), so this is the box plus the grown box within the world:
    the margin never adds anything outside the world."""
    lo = np.maximum(np.array(box.lo) - distance, -MAX_EXTENT)
    hi = np.minimum(np.array(box.hi) + distance, MAX_EXTENT)
    if world is not None:
        lo = np.maximum(lo, np.array(world.lo))
        hi = np.minimum(hi, np.array(world.hi))
    if not np.all(lo < hi):
        return [box]
    return [box, Box(tuple(lo.tolist()), tuple(hi.tolist()))]


def _merge_to(boxes: list[Box], limit: int) -> list[Box]:
    """Merge boxes until at most ``limit`` remain: each step replaces the pair whose bounding
    box wastes the least volume (its volume less theirs) by that bounding box, and drops the
    boxes it swallows. The union only grows, and stays inside the hull of the input."""
    while len(boxes) > limit:
        lo = np.array([b.lo for b in boxes])
        hi = np.array([b.hi for b in boxes])
        volume = np.prod(hi - lo, axis=1)
        pair_volume = np.prod(
            np.maximum(hi[:, None, :], hi[None, :, :]) - np.minimum(lo[:, None, :], lo[None, :, :]),
            axis=2,
        )
        waste = pair_volume - volume[:, None] - volume[None, :]
        np.fill_diagonal(waste, np.inf)
        i, j = np.unravel_index(int(np.argmin(waste)), waste.shape)
        merged = _hull([boxes[i], boxes[j]])
        boxes = [b for b in boxes if not _inside(b, merged)] + [merged]
    return boxes


def _tidy(boxes: list[Box]) -> list[Box]:
    """Drop boxes inside another and join pairs whose union is itself a box: fewer upstream
    subscriptions for the same union."""
    boxes = list(dict.fromkeys(boxes))
    changed = True
    while changed:
        changed = False
        for i, a in enumerate(boxes):
            for j, b in enumerate(boxes):
                if i == j:
                    continue
                if _inside(a, b) or _joins(a, b):
                    joined = b if _inside(a, b) else _hull([a, b])
                    boxes = [x for k, x in enumerate(boxes) if k not in (i, j)] + [joined]
                    changed = True
                    break
            if changed:
                break
    return boxes


def _joins(a: Box, b: Box) -> bool:
    """Whether ``a`` and ``b`` agree on all axes but one, where they touch or overlap."""
    differ = [k for k in range(a.dim) if (a.lo[k], a.hi[k]) != (b.lo[k], b.hi[k])]
    if len(differ) != 1:
        return len(differ) == 0
    k = differ[0]
    return a.lo[k] <= b.hi[k] and b.lo[k] <= a.hi[k]


# -- subscribe and unsubscribe -------------------------------------------------------------


def add(
    current_upstream: Sequence[Box],
    region: Region,
    policy: UpstreamPolicy,
    world: Box | None = None,
) -> tuple[list[Box], list[Box]]:
    """The subscribe path (claim 1): the upstream set after ``region`` is subscribed, and the
    boxes in it that are new (to subscribe to upstream).

    Nothing changes when the current boxes cover the region. Otherwise only the uncovered
    part is added (grown by the margin; under ``bounding`` the one box grows instead). When
    the set outgrows ``policy.max_boxes`` boxes are merged, so a box of ``current_upstream``
    may be missing from the result: the caller unsubscribes those after subscribing the
    added ones (the new set covers everything the old one did).
    """
    region = _check_region(region)
    current = _check_dims(current_upstream, region.dim, "upstream")
    if world is not None:
        _check_dims([world], region.dim, "world")
    pieces = uncovered(current, region)
    if not pieces:
        return current, []
    if policy.kind == "bounding":
        box = _hull([*current, region.bounds()])
        return [box], [box]
    if len(pieces) > policy.max_boxes:
        pieces = [_hull(pieces)]
    if policy.kind == "margin" and policy.distance > 0:
        grown = [part for piece in pieces for part in _grown(piece, policy.distance, world)]
        pieces = _subtract(grown, current)
        if len(pieces) > policy.max_boxes:
            pieces = [_hull(pieces)]
    new = _merge_to([*current, *pieces], policy.max_boxes)
    known = set(current)
    return new, [b for b in new if b not in known]


def plan(
    live_regions: Iterable[Region],
    policy: UpstreamPolicy,
    world: Box | None = None,
) -> list[Box]:
    """The upstream set the live regions need, computed from scratch (the unsubscribe path:
    what no live region needs any more falls away).

    Under ``exact`` and ``margin`` every upstream box lies within the margin of some live
    region's bounding box as long as the set stays under ``max_boxes``; past it, within the
    bounding box of all of them grown by the margin. Under ``bounding`` it is the one
    bounding box of the live regions.
    """
    regions = [_check_region(r, f"live_regions[{i}]") for i, r in enumerate(live_regions)]
    if not regions:
        return []
    dim = regions[0].dim
    for index, region in enumerate(regions):
        if region.dim != dim:
            raise IntermediaryError(
                f"live_regions[{index}]: has {region.dim} dimensions, expected {dim}"
            )
    if policy.kind == "bounding":
        return [_hull(region.bounds() for region in regions)]
    upstream: list[Box] = []
    for region in regions:
        upstream, _ = add(upstream, region, policy, world)
    return _tidy(upstream)
