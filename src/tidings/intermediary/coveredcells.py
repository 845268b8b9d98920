"""A quick, conservative "are these upstream boxes covering this box" for moving regions.

Every epoch an intermediary checks that each relative region ([72]) is still covered where
its entity now is. The exact test (:func:`.coverage.covers`) builds a grid over the region
cut at every upstream boundary: about a millisecond when a region straddles several boxes,
which hundreds of subscribers following agents near each other do every epoch. This index
answers most of them in microseconds: space is cut into a fixed grid of :data:`CELLS` cells
per axis over the boxes' hull, a cell is marked when it lies wholly inside one upstream box,
and a box is covered if every cell it touches is marked. A "no" only means "ask the exact
test": a cell inside the union but not inside one box stays unmarked.

Why it is sound: cell ``i`` on an axis spans ``[o + i*c, o + (i+1)*c]``, computed the same
way when marking and when asking; a cell is marked only if both edges lie inside a box, and
the cells asked about always reach past the box asked about. So "yes" implies the box lies
in the union of the upstream boxes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tidings.intermediary.geometry import Box

#: Cells per axis (2D: 65,536 cells; 3D: 262,144).
CELLS = {2: 256, 3: 64}


class CoveredCells:
    """Cells wholly inside one of ``boxes`` (all of one dimension)."""

    def __init__(self, boxes: Sequence[Box]) -> None:
        self.empty = not boxes
        if self.empty:
            return
        dim = boxes[0].dim
        lo = [min(b.lo[axis] for b in boxes) for axis in range(dim)]
        hi = [max(b.hi[axis] for b in boxes) for axis in range(dim)]
        n = CELLS[dim]
        self._origin = lo
        self._cell = [(h - o) / n for o, h in zip(lo, hi, strict=True)]
        self._n = n
        self._marked = np.zeros((n,) * dim, dtype=bool)
        for box in boxes:
            span = []
            for axis in range(dim):
                first, last = self._inner(axis, box.lo[axis], box.hi[axis])
                if first >= last:
                    break
                span.append(slice(first, last))
            else:
                self._marked[tuple(span)] = True

    def _edge(self, axis: int, i: int) -> float:
        return self._origin[axis] + i * self._cell[axis]

    def _inner(self, axis: int, lo: float, hi: float) -> tuple[int, int]:
        """Cells ``[first, last)`` lying wholly within ``[lo, hi]`` on ``axis``."""
        first = max(0, math.ceil((lo - self._origin[axis]) / self._cell[axis]))
        if self._edge(axis, first) < lo:
            first += 1
        last = min(self._n, math.floor((hi - self._origin[axis]) / self._cell[axis]))
        if self._edge(axis, last) > hi:
            last -= 1
        return first, last

    def covers(self, box: Box) -> bool:
        """True only if ``box`` lies within the union of the boxes (see the module doc)."""
        if self.empty:
            return False
        span = []
        for axis, (lo, hi) in enumerate(zip(box.lo, box.hi, strict=True)):
            cell = self._cell[axis]
            if cell <= 0:
                return False
            first = math.floor((lo - self._origin[axis]) / cell)
            if self._edge(axis, first) > lo:
                first -= 1
            last = math.floor((hi - self._origin[axis]) / cell)
            if self._edge(axis, last + 1) < hi:
                last += 1
            if first < 0 or last >= self._n:
                return False
            span.append(slice(first, last + 1))
        return bool(self._marked[tuple(span)].all())
