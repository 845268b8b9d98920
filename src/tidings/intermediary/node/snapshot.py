"""A read-only view of an intermediary's active state at one epoch, without a copy: what
generation reads (:class:`Snapshot`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from tidings.errors import UsageError
from tidings.intermediary.node.batches import as_ids
from tidings.intermediary.node.buffers import Buffer, read_only


class Snapshot:
    """An immutable view of the active state at one epoch (no copy).

    ``ids`` (sorted ascending), ``positions`` and ``columns`` are read-only numpy views.
    They stay valid and unchanged for as long as anything references them, across any number
    of later epochs; drop the snapshot (and arrays taken from it) when the generation round
    is done, so the store can reuse the buffer instead of copying.
    """

    __slots__ = ("columns", "dim", "epoch", "ids", "positions", "tick", "tick_time")

    def __init__(self, epoch: int, buffer: Buffer, tick: int = 0, tick_time: float = 0.0) -> None:
        n = buffer.n
        self.epoch = epoch
        #: The newest publisher tick (and its wall-clock time) this epoch's state holds.
        self.tick = tick
        self.tick_time = tick_time
        self.dim = int(buffer.arrays["positions"].shape[1])
        self.ids = read_only(buffer.arrays["ids"][:n])
        self.positions = read_only(buffer.arrays["positions"][:n])
        self.columns: Mapping[str, np.ndarray] = MappingProxyType(
            {name: read_only(buffer.arrays[name][:n]) for name in buffer.specs}
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Snapshot(epoch={self.epoch}, entities={len(self)}, dim={self.dim})"

    def column(self, name: str) -> np.ndarray:
        """The extra column ``name`` (read-only)."""
        try:
            return self.columns[name]
        except KeyError:
            raise UsageError(
                f"no column {name!r}; the store has {sorted(self.columns) or 'none'}"
            ) from None

    def rows_in(self, mask: npt.ArrayLike) -> np.ndarray:
        """Row indices (int64) where the boolean ``mask`` (one value per entity) is true."""
        array = np.asarray(mask)
        if array.dtype != np.bool_ or array.shape != (len(self),):
            raise UsageError(
                f"mask must be a bool array of shape ({len(self)},), "
                f"not {array.dtype} {array.shape}"
            )
        return np.flatnonzero(array)

    def rows_of(self, ids: npt.ArrayLike) -> np.ndarray:
        """Row index of each id (int64), -1 where the id is not in this snapshot."""
        wanted = as_ids(ids, "ids")
        rows = np.searchsorted(self.ids, wanted)
        out = np.full(len(wanted), -1, dtype=np.int64)
        inside = rows < len(self.ids)
        hit = np.zeros(len(wanted), dtype=bool)
        hit[inside] = self.ids[rows[inside]] == wanted[inside]
        out[hit] = rows[hit]
        return out

    def position_of(self, entity_id: int) -> np.ndarray | None:
        """The position of one entity (a read-only row), or None if it is not there."""
        row = int(self.rows_of([entity_id])[0])
        return None if row < 0 else self.positions[row]
