"""What the upstream already sends, for an upstream that applies requests later than the next
batch (one in another process, :mod:`.feed.wire`): an intermediary must not serve a view
from state its upstream did not fill yet, or the view would lack entities it should hold.

The upstream counts its operations (:func:`.node.intermediary.requests_of`: requested, and how many
the batches taken so far reflect). After each change the intermediary records the upstream box set
it asked for, numbered with the request count; the boxes of the latest record whose number the
batches reflect are what the state holds. A view whose region they do not cover waits (is not
served) until the batches reflect the request that covers it.

Why not trust the requested set: two subscribers asking for the same new place one after the
other, the second is covered by the first's request, which upstream has not applied yet.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from tidings.intermediary.regions.coveredcells import CoveredCells, bounds_of
from tidings.intermediary.regions.geometry import Box, Region


class AppliedBoxes:
    """The upstream box sets asked for, by request count (see the module docstring)."""

    def __init__(self) -> None:
        self._sent: deque[tuple[int, tuple[Box, ...]]] = deque()
        self._cells: tuple[tuple[Box, ...], CoveredCells] | None = None

    def sent(self, count: int, boxes: Sequence[Box]) -> None:
        """The upstream was asked for ``boxes`` in all; ``count`` requests so far."""
        self._sent.append((count, tuple(boxes)))

    def uncovered(
        self,
        regions: Sequence[Region],
        applied: int,
        bounds: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[int]:
        """Which of ``regions`` (indices) the boxes upstream applied (its first ``applied``
        requests) do not cover; ``bounds``: their :func:`.coveredcells.bounds_of`, if known."""
        if not regions:
            return []
        cells = self._applied_cells(applied)
        covered = cells.covers_bounds(*(bounds if bounds is not None else bounds_of(regions)))
        return [
            i
            for i, region in enumerate(regions)
            if not covered[i] and not cells.covers_region(region)
        ]

    def _applied_cells(self, applied: int) -> CoveredCells:
        # Records the batches reflect: all but the latest of them are history now.
        while len(self._sent) > 1 and self._sent[1][0] <= applied:
            self._sent.popleft()
        boxes = self._sent[0][1] if self._sent and self._sent[0][0] <= applied else ()
        if self._cells is None or self._cells[0] != boxes:
            self._cells = (boxes, CoveredCells(boxes))
        return self._cells[1]
