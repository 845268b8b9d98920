"""A quick "do these upstream boxes cover this box" for moving regions, built once per set of
upstream boxes rather than once per question.

Every epoch an intermediary checks that each relative region ([72]) is still covered where
its entity now is. The exact test (:func:`.coverage.covers`) cuts the region's bounding box
at every upstream boundary inside it and paints the cells: about a millisecond, per region
per epoch, for hundreds of subscribers following agents. Here the cut is made once for the
whole set: the axes are cut at every boundary of every upstream box (at most ``2 * boxes``
cuts per axis), each cell lies wholly inside or wholly outside each box, and a cell is
painted when some box holds it. A box is then covered iff every cell it overlaps is
painted: two bisections per axis and one ``all`` over a slice. A sphere or sector whose
bounding box is not all painted is then tested on the cells of that slice it may touch
(:meth:`CoveredCells.covers_region`), on the same grid: the exact test's ~0.8 ms per such
region went to cutting and painting a grid of its own each time.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np

from tidings.intermediary.regions import coverage
from tidings.intermediary.regions.geometry import Box, Region, Sphere


class CoveredCells:
    """The union of ``boxes`` (all of one dimension) on the grid of their boundaries."""

    def __init__(self, boxes: Sequence[Box]) -> None:
        self.empty = not boxes
        self._boxes = list(boxes)
        if self.empty:
            return
        dim = boxes[0].dim
        self._axes = [
            sorted({b.lo[axis] for b in boxes} | {b.hi[axis] for b in boxes}) for axis in range(dim)
        ]
        self._painted = np.zeros([len(a) - 1 for a in self._axes], dtype=bool)
        for box in boxes:
            span = tuple(
                slice(bisect_left(cuts, lo), bisect_left(cuts, hi))
                for cuts, lo, hi in zip(self._axes, box.lo, box.hi, strict=True)
            )
            self._painted[span] = True
        # Painted cells counted from the origin (a summed-area table, zero-padded in front):
        # the painted cells of any span in 2**dim lookups, for many boxes at once.
        counts = np.pad(self._painted.astype(np.int64), [(1, 0)] * dim)
        for axis in range(dim):
            counts = np.cumsum(counts, axis=axis)
        self._counts = counts
        self._cut_arrays = [np.asarray(cuts, dtype=np.float64) for cuts in self._axes]

    def covers(self, box: Box) -> bool:
        """Whether ``box`` lies within the union of the boxes."""
        span = self._span(box)
        return span is not None and bool(self._painted[span].all())

    def covers_region(self, region: Region) -> bool:
        """Whether ``region`` lies within the union of the boxes: exact for a box, and for a
        sphere or sector as conservative as :func:`.coverage.covers` (never True for one
        that is not covered). The cells of its bounding box that it may touch
        (:func:`.coverage.touching`, on this grid's cuts clipped to the bounding box) must
        all be painted; this grid is never coarser than the one :func:`.coverage.covers`
        would cut for the same question, and is cut and painted once for every question."""
        bounds = region.bounds()
        span = self._span(bounds)
        if span is None:
            return False
        painted = self._painted[span]
        if painted.all():
            return True
        if isinstance(region, Box):
            return False  # a cell it overlaps is not painted: exact for a box
        if painted.size > coverage.MAX_GRID_CELLS:
            return coverage.covers(self._boxes, region)  # which splits such a grid
        axes = []
        for cuts, cells, lo, hi in zip(self._axes, span, bounds.lo, bounds.hi, strict=True):
            ends = np.array(cuts[cells.start : cells.stop + 1])
            ends[0], ends[-1] = lo, hi
            axes.append(ends)
        return not (coverage.touching(region, axes) & ~painted).any()

    def covers_bounds(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """For many boxes at once (rows of ``lo`` and ``hi``, ``(k, dim)``): whether each lies
        within the union, as :meth:`covers` answers one (the bounding boxes of moving
        regions: most are covered and need no further test)."""
        k = len(lo)
        if self.empty or k == 0:
            return np.zeros(k, dtype=bool)
        inside = np.ones(k, dtype=bool)
        first, last = [], []
        for axis, cuts in enumerate(self._cut_arrays):
            inside &= (lo[:, axis] >= cuts[0]) & (hi[:, axis] <= cuts[-1])
            # As _span: from the cell holding lo to the one ending at or after hi.
            start = np.searchsorted(cuts, lo[:, axis], side="right") - 1
            stop = np.searchsorted(cuts, hi[:, axis], side="left")
            first.append(np.clip(start, 0, len(cuts) - 1))
            last.append(np.clip(stop, 0, len(cuts) - 1))
        cells = np.ones(k, dtype=np.int64)
        for start, stop in zip(first, last, strict=True):
            cells *= np.maximum(stop - start, 0)
        painted = np.zeros(k, dtype=np.int64)
        for corner in itertools.product((0, 1), repeat=len(first)):
            index = tuple(
                stop if high else start
                for high, start, stop in zip(corner, first, last, strict=True)
            )
            sign = -1 if (len(first) - sum(corner)) % 2 else 1
            painted += sign * self._counts[index]
        covered: np.ndarray = inside & (painted == cells)
        return covered

    def _span(self, box: Box) -> tuple[slice, ...] | None:
        """The cells ``box`` overlaps, or None if it reaches outside every box."""
        if self.empty:
            return None
        span = []
        for cuts, lo, hi in zip(self._axes, box.lo, box.hi, strict=True):
            if lo < cuts[0] or hi > cuts[-1]:
                return None
            # The cell holding lo (the one starting there if lo is a cut) up to the one
            # ending at or after hi.
            span.append(slice(bisect_right(cuts, lo) - 1, bisect_left(cuts, hi)))
        return tuple(span)


def bounds_of(regions: Sequence[Region]) -> tuple[np.ndarray, np.ndarray]:
    """The regions' bounding boxes as ``lo`` and ``hi`` rows, for
    :meth:`CoveredCells.covers_bounds`."""
    los: list[Sequence[float]] = []
    his: list[Sequence[float]] = []
    for region in regions:
        if isinstance(region, Sphere):  # the numbers Sphere.bounds gives, without a Box
            r = region.radius
            los.append([x - r for x in region.center])
            his.append([x + r for x in region.center])
        else:
            box = region.bounds()
            los.append(box.lo)
            his.append(box.hi)
    lo = np.array(los, dtype=np.float64).reshape(len(los), -1)
    hi = np.array(his, dtype=np.float64).reshape(len(his), -1)
    return lo, hi
