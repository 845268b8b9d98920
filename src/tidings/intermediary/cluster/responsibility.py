"""Which slot of responsibility a subscription belongs to ([75], [112], [116]): by region or by
hash of the subscriber's id, configurable.

* :class:`RegionPartition` cuts the world into a grid of cells (the slots). A subscription's
  **home** is the cell holding the middle of its region's bounding box; the cells its
  bounding box touches are the **areas** its view is generated from. An intermediary owning
  some cells keeps state for those cells only (its upstream is clipped to them), so the
  cluster can hold a world larger than any one of its members ([108]).
* :class:`HashPartition` cuts subscribers into buckets by a stable hash (BLAKE2b) of the id
  the client declares, so one client's subscriptions all live at one intermediary wherever
  it connects; every member may hold state anywhere (no areas).

A partition travels to a member in another process as JSON (:func:`partition_spec`, read
back by :func:`partition_from`).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tidings.errors import IntermediaryError
from tidings.intermediary.regions.geometry import Box, Relative, Subscription

#: The most slots a partition may have (each is a row of the directory).
MAX_SLOTS = 65_536
#: The longest client id accepted for hashing.
MAX_CLIENT_ID = 128


def _overlap(a: Box, b: Box) -> Box | None:
    """The intersection of two boxes, or None when it has no volume (touching faces do not
    count: the neighbour owns them as much as we do)."""
    lo = np.maximum(a.lo, b.lo)
    hi = np.minimum(a.hi, b.hi)
    if np.any(lo >= hi):
        return None
    return Box(tuple(float(v) for v in lo), tuple(float(v) for v in hi))


@dataclass(frozen=True)
class RegionPartition:
    """The world cut into ``cells[i]`` equal cells along axis ``i`` (slots numbered in
    row-major order)."""

    world: Box
    cells: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.world, Box):
            raise IntermediaryError("responsibility: world must be a Box")
        if len(self.cells) != self.world.dim or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.cells
        ):
            raise IntermediaryError(
                f"responsibility: cells must be {self.world.dim} positive ints, not {self.cells!r}"
            )
        if math.prod(self.cells) > MAX_SLOTS:
            raise IntermediaryError(f"responsibility: more than {MAX_SLOTS} cells")

    @property
    def slots(self) -> range:
        return range(math.prod(self.cells))

    def cell(self, slot: int) -> Box:
        """The box of cell ``slot``."""
        index = np.unravel_index(slot, self.cells)
        lo = np.asarray(self.world.lo)
        size = (np.asarray(self.world.hi) - lo) / np.asarray(self.cells)
        low = lo + size * np.asarray(index)
        return Box(tuple(float(v) for v in low), tuple(float(v) for v in low + size))

    def _index(self, point: np.ndarray) -> np.ndarray:
        lo = np.asarray(self.world.lo)
        size = (np.asarray(self.world.hi) - lo) / np.asarray(self.cells)
        index = np.floor((point - lo) / size).astype(np.int64)
        clipped: np.ndarray = np.clip(index, 0, np.asarray(self.cells) - 1)
        return clipped

    def _bounds(self, region: Subscription) -> Box:
        if isinstance(region, Relative):
            raise IntermediaryError(
                "responsibility: a region relative to an entity has no fixed home under "
                "responsibility by region; use responsibility by hash for it"
            )
        return region.bounds()

    def home(self, region: Subscription, client: str | None = None) -> int:
        """The cell holding the middle of ``region``'s bounding box."""
        box = self._bounds(region)
        middle = (np.asarray(box.lo) + np.asarray(box.hi)) / 2
        return int(np.ravel_multi_index(tuple(self._index(middle)), self.cells))

    def areas(self, region: Subscription) -> list[int]:
        """The cells ``region``'s bounding box overlaps (with volume), home included."""
        box = self._bounds(region)
        first = self._index(np.asarray(box.lo))
        last = self._index(np.asarray(box.hi))
        found = []
        for index in itertools.product(
            *(range(a, b + 1) for a, b in zip(first, last, strict=True))
        ):
            slot = int(np.ravel_multi_index(index, self.cells))
            if _overlap(self.cell(slot), box) is not None:
                found.append(slot)
        home = self.home(region)
        return found if home in found else [home, *found]

    def clip(self, box: Box, slots: Sequence[int]) -> list[Box]:
        """The parts of ``box`` inside the cells ``slots``, one per overlapped cell."""
        parts = (_overlap(box, self.cell(slot)) for slot in slots)
        return [part for part in parts if part is not None]


@dataclass(frozen=True)
class HashPartition:
    """``buckets`` slots; a subscription's slot is a stable hash of its client's id."""

    buckets: int

    def __post_init__(self) -> None:
        n = self.buckets
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SLOTS:
            raise IntermediaryError(f"responsibility: buckets must be in 1..{MAX_SLOTS}")

    @property
    def slots(self) -> range:
        return range(self.buckets)

    def home(self, region: Subscription, client: str | None = None) -> int:
        if not isinstance(client, str) or not 0 < len(client) <= MAX_CLIENT_ID:
            raise IntermediaryError(
                f"request.client: responsibility by hash needs the client's id "
                f"(a string of 1..{MAX_CLIENT_ID} characters)"
            )
        digest = hashlib.blake2b(client.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self.buckets

    def areas(self, region: Subscription) -> None:
        """No areas: every member may keep state anywhere."""
        return None


Partition = RegionPartition | HashPartition


def partition_from(spec: dict[str, Any]) -> Partition:
    """The partition a plan names (``{"grid": cells, "world": [lo, hi]}`` or
    ``{"hash": n}``); the inverse of :func:`partition_spec`."""
    if "hash" in spec:
        return HashPartition(spec["hash"])
    return RegionPartition(Box(*spec["world"]), tuple(spec["grid"]))


def partition_spec(partition: Partition) -> dict[str, Any]:
    """The JSON form of ``partition`` for a member's plan."""
    if isinstance(partition, HashPartition):
        return {"hash": partition.buckets}
    if isinstance(partition, RegionPartition):
        world = partition.world
        return {"grid": list(partition.cells), "world": [list(world.lo), list(world.hi)]}
    raise IntermediaryError(f"cluster: cannot start members of a {type(partition).__name__}")
