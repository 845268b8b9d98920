"""One copy of an intermediary's state, columnar: ``ids`` (int64, sorted ascending),
``positions`` (float64, ``[n, dim]``) and the declared extra columns, held in numpy arrays
with room to grow (amortised doubling), never one Python object per entity. The state store
(:mod:`.state`) keeps two of them.

Why sorted ids: the id -> row map is ``np.searchsorted`` over the id column, so it costs no
Python object per entity (a dict of 50,000 ints would) and every lookup, upsert and delete
of a batch is vectorised. Inserting or deleting moves rows, which is O(n) per batch, done
by numpy; updating existing entities (the common case of a moving simulation) is in place.
Both buffers apply the same operations in the same order, so their layouts stay identical.

Whether a reader still holds a buffer (:func:`in_use`) is read from CPython's reference
counts of its arrays: a snapshot's read-only views (:func:`read_only`) keep a reference to
the arrays they view, so the count is exact, and it covers arrays taken out of a snapshot,
not only the snapshot object.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import numpy as np

from tidings.intermediary.node.batches import Column, ValidatedBatch


class Buffer:
    """One copy of the state: owner arrays with spare capacity; rows ``[:n]`` are live."""

    __slots__ = ("arrays", "n", "specs")

    def __init__(self, dim: int, specs: Mapping[str, Column], capacity: int) -> None:
        self.specs = specs
        self.n = 0
        self.arrays: dict[str, np.ndarray] = {
            "ids": np.zeros(capacity, dtype=np.int64),
            "positions": np.zeros((capacity, dim), dtype=np.float64),
        }
        for name, spec in specs.items():
            self.arrays[name] = np.full(spec.shape(capacity), spec.default, dtype=spec.dtype)

    @property
    def capacity(self) -> int:
        return len(self.arrays["ids"])

    def copy(self) -> Buffer:
        clone = Buffer.__new__(Buffer)
        clone.specs = self.specs
        clone.n = self.n
        clone.arrays = {name: array.copy() for name, array in self.arrays.items()}
        return clone

    def same_as(self, other: Buffer) -> bool:
        if self.n != other.n:
            return False
        n = self.n
        return all(
            np.array_equal(array[:n], other.arrays[name][:n], equal_nan=array.dtype.kind == "f")
            for name, array in self.arrays.items()
        )

    def rows_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Insertion points of ``ids`` and which of them are present."""
        live = self.arrays["ids"][: self.n]
        rows = np.searchsorted(live, ids)
        found = np.zeros(len(ids), dtype=bool)
        inside = rows < self.n
        found[inside] = live[rows[inside]] == ids[inside]
        return rows, found

    def resize(self, capacity: int) -> None:
        """Reallocate every array to ``capacity`` rows, keeping rows ``[:n]``."""
        for name, array in self.arrays.items():
            grown = np.empty((capacity, *array.shape[1:]), dtype=array.dtype)
            grown[: self.n] = array[: self.n]
            self.arrays[name] = grown

    def apply(self, ops: ValidatedBatch) -> None:
        """Apply upserts, then deletions; the same ops give the same layout in any buffer."""
        if len(ops.ids):
            self._upsert(ops)
        if len(ops.delete):
            self._delete(ops.delete)

    def _upsert(self, ops: ValidatedBatch) -> None:
        n = self.n
        rows, found = self.rows_of(ops.ids)
        existing = rows[found]
        self.arrays["positions"][existing] = ops.positions[found]
        for name, values in ops.columns.items():
            self.arrays[name][existing] = values[found]
        new = ~found
        k = int(np.count_nonzero(new))
        if not k:
            return
        if n + k > self.capacity:
            self.resize(max(2 * self.capacity, n + k, 16))
        new_ids = ops.ids[new]
        # Final rows: an old row moves down by the number of new ids smaller than its id; the
        # new ids (sorted) land at their insertion point plus the new ids before them.
        old_dest = np.arange(n) + np.searchsorted(new_ids, self.arrays["ids"][:n])
        new_dest = rows[new] + np.arange(k)
        for name, array in self.arrays.items():
            old = array[:n].copy()
            array[old_dest] = old
            if name == "ids":
                array[new_dest] = new_ids
            elif name == "positions":
                array[new_dest] = ops.positions[new]
            elif name in ops.columns:
                array[new_dest] = ops.columns[name][new]
            else:
                array[new_dest] = self.specs[name].default
        self.n = n + k

    def _delete(self, ids: np.ndarray) -> None:
        rows, found = self.rows_of(ids)
        if not found.any():
            return
        keep = np.ones(self.n, dtype=bool)
        keep[rows[found]] = False
        m = int(np.count_nonzero(keep))
        for array in self.arrays.values():
            array[:m] = array[: self.n][keep]
        self.n = m
        if self.capacity > 64 and m < self.capacity // 4:
            self.resize(max(self.capacity // 2, 16))


def _extra_refs_baseline() -> int:
    probe = {"x": np.zeros(1)}
    return max(sys.getrefcount(array) for array in probe.values())


#: References an owner array has when only its buffer holds it (measured the way
#: :func:`in_use` measures, so it holds for this interpreter).
_BASELINE = _extra_refs_baseline()


def in_use(buffer: Buffer) -> bool:
    """Tell whether any view of the buffer's arrays is alive (a reader still holds it)."""
    return max(sys.getrefcount(array) for array in buffer.arrays.values()) > _BASELINE


def read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view
