"""A uniform grid over entity positions, so that "which entities may lie in this box" costs a
few contiguous slices instead of a pass over every entity.

Generating a thousand views of 50,000 entities ten times a second by testing every entity
against every region is 500 million point tests a second; with the entities sorted by grid
cell once per epoch, a view tests only the entities of the cells its bounding box touches.
The index is built from one positions array (a snapshot's, or the simulation's at a tick)
in O(n log n) with numpy, holds no reference to that array (so the state store's "is a
reader still holding this buffer" check is unaffected), and answers with row numbers into
it, ascending (the state store's id order, which frames keep).

Cell size: about :data:`ENTITIES_PER_CELL` entities per cell on average over the cells the
positions occupy (not their whole bounding box: clustered entities would crowd a few cells),
so a typical view touches a handful of cells. A box touching more than
:data:`MAX_SLICES` runs of cells is answered with None ("test them all"): for a region
larger than a good part of the world, the full vectorised pass is as cheap; so is one
touching more than :data:`FULL_PASS` of the cells.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from tidings.intermediary.regions.geometry import Box

#: The average number of entities per cell the grid is sized for.
ENTITIES_PER_CELL = 8
#: The most cells per entity the grid may have when sized for clustered entities.
MAX_CELLS_PER_ENTITY = 2
#: The most runs of cells (rows of the grid along its last axis) one query gathers.
MAX_SLICES = 256
#: A box touching more than this share of the cells gets None: gathering and sorting most
#: of the rows costs more than one vectorised pass over all of them.
FULL_PASS = 0.25


class GridIndex:
    """Rows of an ``(n, dim)`` positions array, grouped by grid cell."""

    def __init__(self, positions: np.ndarray) -> None:
        n, dim = positions.shape
        self.dim = dim
        self.size = n
        if n == 0:
            self._lo = np.zeros(dim)
            self._cell = 1.0
            self._shape = np.ones(dim, dtype=np.int64)
            keys = np.zeros(0, dtype=np.int64)
        else:
            self._lo = positions.min(axis=0)
            extent = np.maximum(positions.max(axis=0) - self._lo, 1e-9)
            cells = max(1, n // ENTITIES_PER_CELL)
            self._cell = float((np.prod(extent) / cells) ** (1 / dim))
            self._shape = np.floor(extent / self._cell).astype(np.int64) + 1
            # Clustered entities (an intermediary holds the areas its subscribers watch)
            # leave most of the bounding box empty: size the cells for the occupied part.
            total = int(np.prod(self._shape))
            coords = self._coords(positions)
            keys = np.ravel_multi_index(tuple(coords.T), tuple(self._shape))
            occupied = np.count_nonzero(np.bincount(keys, minlength=total))
            # Bounded: at most MAX_CELLS_PER_ENTITY cells per entity, and few enough cells
            # (half the 16-bit range, for rounding) that the keys still sort by radix.
            limit = min(MAX_CELLS_PER_ENTITY * n, 1 << 15)
            shrink = max(occupied / total, total / limit)
            if shrink < 0.5:  # new cells: new keys
                self._cell *= shrink ** (1 / dim)
                self._shape = np.floor(extent / self._cell).astype(np.int64) + 1
                coords = self._coords(positions)
                keys = np.ravel_multi_index(tuple(coords.T), tuple(self._shape))
        self._cells = int(np.prod(self._shape))
        if self._cells <= 1 << 16:
            keys = keys.astype(np.uint16)  # numpy sorts 16-bit keys by radix: ~9x faster
        self._order = np.argsort(keys, kind="stable")
        counts = np.bincount(keys, minlength=self._cells)
        # A list: indexed a few times per query, where numpy's scalar indexing costs more.
        self._starts: list[int] = [0, *np.cumsum(counts).tolist()]
        self._origin = [float(x) for x in self._lo]
        self._top = [int(x) - 1 for x in self._shape]
        # The key stride of every axis but the last (row-major, as ravel_multi_index).
        self._strides = [int(x) for x in np.cumprod(self._shape[::-1])[::-1][1:]]

    def _coords(self, points: np.ndarray) -> np.ndarray:
        cells = np.floor((points - self._lo) / self._cell).astype(np.int64)
        return np.clip(cells, 0, self._shape - 1)

    def candidates(self, box: Box) -> np.ndarray | None:
        """Rows whose cell the box touches (a superset of those inside it), ascending; None
        when the box touches too many runs of cells to be worth gathering."""
        empty = np.zeros(0, dtype=np.int64)
        if self.size == 0:
            return empty
        # Plain Python on a few numbers: numpy's per-call cost would dominate here.
        span: list[tuple[int, int]] = []
        for a, b, origin, top in zip(box.lo, box.hi, self._origin, self._top, strict=True):
            first = math.floor((a - origin) / self._cell)
            last = math.floor((b - origin) / self._cell)
            if last < 0 or first > top:
                return empty
            span.append((max(first, 0), min(last, top)))
        outer = [range(first, last + 1) for first, last in span[:-1]]
        runs = math.prod(len(r) for r in outer)
        if runs > MAX_SLICES or runs * (span[-1][1] - span[-1][0] + 1) > self._cells * FULL_PASS:
            return None
        first, last = span[-1]
        starts, order = self._starts, self._order
        slices = []
        for cell in itertools.product(*outer):
            base = sum(c * stride for c, stride in zip(cell, self._strides, strict=True))
            begin, end = starts[base + first], starts[base + last + 1]
            if end > begin:
                slices.append(order[begin:end])
        if not slices:
            return empty
        return np.sort(np.concatenate(slices))

    def candidates_many(
        self, lo: np.ndarray, hi: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`candidates` for ``k`` boxes at once (``lo``, ``hi``: ``(k, dim)``), in a
        few numpy passes instead of Python per box: the candidate rows of every box, box
        after box (not sorted within a box), which box each belongs to, and which boxes
        :meth:`candidates` would answer None for (too many cells: none gathered for them)."""
        empty = np.zeros(0, dtype=np.int64)
        if self.size == 0 or len(lo) == 0:
            return empty, empty, np.zeros(len(lo), dtype=bool)
        origin = np.asarray(self._origin)
        first = np.floor((lo - origin) / self._cell).astype(np.int64)
        last = np.floor((hi - origin) / self._cell).astype(np.int64)
        outside = np.any((last < 0) | (first > self._shape - 1), axis=1)
        first = np.clip(first, 0, self._shape - 1)
        last = np.clip(last, 0, self._shape - 1)
        sizes = np.where(outside[:, None], 0, last - first + 1)
        # One run of cells per box and combination of its cells on every axis but the last.
        runs = np.prod(sizes[:, :-1], axis=1)
        large = (runs > MAX_SLICES) | (runs * sizes[:, -1] > self._cells * FULL_PASS)
        runs = np.where(large | (sizes[:, -1] == 0), 0, runs)
        box_of_run = np.repeat(np.arange(len(lo)), runs)
        j = np.arange(len(box_of_run)) - np.repeat(np.cumsum(runs) - runs, runs)
        base = np.zeros(len(box_of_run), dtype=np.int64)
        for axis in range(self.dim - 2, -1, -1):
            size = sizes[box_of_run, axis]
            base += (first[box_of_run, axis] + j % size) * self._strides[axis]
            j //= size
        starts = np.asarray(self._starts)
        begin = starts[base + first[box_of_run, -1]]
        end = starts[base + last[box_of_run, -1] + 1]
        lengths = end - begin
        total = int(lengths.sum())
        at = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths - begin, lengths)
        return np.take(self._order, at), np.repeat(box_of_run, lengths), large
