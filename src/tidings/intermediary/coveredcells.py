"""A quick "do these upstream boxes cover this box" for moving regions, built once per set of
upstream boxes rather than once per question.

Every epoch an intermediary checks that each relative region ([72]) is still covered where
its entity now is. The exact test (:func:`.coverage.covers`) cuts the region's bounding box
at every upstream boundary inside it and paints the cells: about a millisecond, per region
per epoch, for hundreds of subscribers following agents. Here the cut is made once for the
whole set: the axes are cut at every boundary of every upstream box (at most ``2 * boxes``
cuts per axis), each cell lies wholly inside or wholly outside each box, and a cell is
painted when some box holds it. A box is then covered iff every cell it overlaps is
painted: two bisections per axis and one ``all`` over a slice. Exact for boxes; a sphere or
sector is asked about through its bounding box, so a "no" for one only means "ask the
exact test".
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np

from tidings.intermediary.geometry import Box


class CoveredCells:
    """The union of ``boxes`` (all of one dimension) on the grid of their boundaries."""

    def __init__(self, boxes: Sequence[Box]) -> None:
        self.empty = not boxes
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

    def covers(self, box: Box) -> bool:
        """Whether ``box`` lies within the union of the boxes."""
        if self.empty:
            return False
        span = []
        for cuts, lo, hi in zip(self._axes, box.lo, box.hi, strict=True):
            if lo < cuts[0] or hi > cuts[-1]:
                return False
            # The cell holding lo (the one starting there if lo is a cut) up to the one
            # ending at or after hi.
            span.append(slice(bisect_right(cuts, lo) - 1, bisect_left(cuts, hi)))
        return bool(self._painted[tuple(span)].all())
