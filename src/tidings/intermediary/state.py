"""The state store of an intermediary: columnar, double-buffered ([147]-[151], Figs. 10a-b).

An intermediary keeps the state its subscribers' views are generated from (agents of a
simulation, the latest value of event types). Generation must never see a half-applied
epoch, while updates keep arriving from upstream, so the store holds two copies:

* the **active** buffer, which generation reads through :meth:`StateStore.snapshot`;
* the **inert** buffer, which :meth:`StateStore.apply` writes (step 1070a).

:meth:`StateStore.end_epoch` swaps them atomically with respect to :meth:`snapshot` (1070c)
and then brings the new inert buffer up to date by re-applying the epoch's update log
(1070d), so both converge. Each buffer is columnar: ``ids`` (int64, sorted ascending),
``positions`` (float64, ``[n, dim]``) and the declared extra columns, held in numpy arrays
with room to grow (amortised doubling), never one Python object per entity.

Why sorted ids: the id -> row map is ``np.searchsorted`` over the id column, so it costs no
Python object per entity (a dict of 50,000 ints would) and every lookup, upsert and delete
of a batch is vectorised. Inserting or deleting moves rows, which is O(n) per batch, done
by numpy; updating existing entities (the common case of a moving simulation) is in place.
Both buffers apply the same operations in the same order, so their layouts stay identical.

Why readers stay consistent across a swap: a snapshot holds read-only *views* of the active
buffer's arrays, and a numpy view keeps a reference to the array it views. When an epoch
ends, the buffer that was active becomes the inert one and would be written next; if any
view of it is still alive (a generation round that began before the swap, or an array a
reader kept from a snapshot), the store does not write into it: it leaves it to those
readers and makes a fresh inert buffer by copying the new active one ("detaching", counted
in :attr:`StateStore.detached`). The upstream writer therefore never waits for a slow
reader, and a reader never sees its snapshot change. Memory is two buffers plus one per
epoch that a reader still holds a snapshot of; a reader that drops its snapshot after each
generation round keeps it at two. (Whether views are alive is read from CPython's reference
counts of the arrays: exact, and it covers arrays taken out of a snapshot, not only the
snapshot object.)

Batches: within one batch, an id given twice among the upserts takes its **last** values
(an upstream batch is a run of events in order, and the latest is the state); an id both
upserted and deleted in one batch is refused (the order would be a guess); deleting an id
that is not there is a no-op (deletes are idempotent, so a re-sent batch is harmless).
Positions and float columns must be finite; a refusal names the first offending id, and a
refused batch changes nothing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from tidings.errors import UsageError

ColumnDtype = Literal["float64", "int64"]

#: Names the store uses itself; extra columns may not take them.
_RESERVED = frozenset({"ids", "positions"})
#: Default bound on the number of entities one store may hold (bounded memory).
DEFAULT_MAX_ENTITIES = 10_000_000


@dataclass(frozen=True)
class Column:
    """An extra per-entity column: its dtype, its width (1: ``[n]``, k > 1: ``[n, k]``) and
    the value a new entity gets when its first batch does not set the column."""

    dtype: ColumnDtype = "float64"
    width: int = 1
    default: float | int = 0

    def __post_init__(self) -> None:
        if self.dtype not in ("float64", "int64"):
            raise UsageError(f"column dtype must be 'float64' or 'int64', not {self.dtype!r}")
        if (
            isinstance(self.width, bool)
            or not isinstance(self.width, int)
            or not (1 <= self.width <= 64)
        ):
            raise UsageError(f"column width must be an int in 1..64, not {self.width!r}")
        if self.dtype == "float64" and not np.isfinite(float(self.default)):
            raise UsageError(f"column default must be finite, not {self.default!r}")

    def shape(self, n: int) -> tuple[int, ...]:
        """The shape of this column for ``n`` entities."""
        return (n,) if self.width == 1 else (n, self.width)


@dataclass(frozen=True)
class UpdateBatch:
    """One update from upstream: upserts (``ids`` with their ``positions`` and optionally some
    extra columns) and deletions by id. A column left out keeps an existing entity's value
    and gives a new entity the column's default."""

    ids: npt.ArrayLike = ()
    positions: npt.ArrayLike | None = None
    columns: Mapping[str, npt.ArrayLike] = field(default_factory=dict)
    delete: npt.ArrayLike = ()
    #: The publisher's tick this batch brings the state to, if the publisher numbers them
    #: (the epoch it ends becomes that tick, so epochs mean the same thing at every
    #: intermediary), and the publisher's wall-clock time of that tick (Unix seconds; 0:
    #: unknown). Every frame generated from it carries both, so a subscriber measures
    #: staleness as its receipt time less ``tick_time``.
    tick: int | None = None
    tick_time: float = 0.0


@dataclass(frozen=True)
class _Ops:
    """A validated batch, in the store's own arrays: upserts sorted by id, unique."""

    ids: np.ndarray
    positions: np.ndarray
    columns: Mapping[str, np.ndarray]
    delete: np.ndarray


class _Buffer:
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

    def copy(self) -> _Buffer:
        clone = _Buffer.__new__(_Buffer)
        clone.specs = self.specs
        clone.n = self.n
        clone.arrays = {name: array.copy() for name, array in self.arrays.items()}
        return clone

    def same_as(self, other: _Buffer) -> bool:
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

    def apply(self, ops: _Ops) -> None:
        """Apply upserts, then deletions; the same ops give the same layout in any buffer."""
        if len(ops.ids):
            self._upsert(ops)
        if len(ops.delete):
            self._delete(ops.delete)

    def _upsert(self, ops: _Ops) -> None:
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
#: :func:`_in_use` measures, so it holds for this interpreter).
_BASELINE = _extra_refs_baseline()


def _in_use(buffer: _Buffer) -> bool:
    """Tell whether any view of the buffer's arrays is alive (a reader still holds it)."""
    return max(sys.getrefcount(array) for array in buffer.arrays.values()) > _BASELINE


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class Snapshot:
    """An immutable view of the active state at one epoch (no copy).

    ``ids`` (sorted ascending), ``positions`` and ``columns`` are read-only numpy views.
    They stay valid and unchanged for as long as anything references them, across any number
    of later epochs; drop the snapshot (and arrays taken from it) when the generation round
    is done, so the store can reuse the buffer instead of copying.
    """

    __slots__ = ("columns", "dim", "epoch", "ids", "positions", "tick", "tick_time")

    def __init__(self, epoch: int, buffer: _Buffer, tick: int = 0, tick_time: float = 0.0) -> None:
        n = buffer.n
        self.epoch = epoch
        #: The newest publisher tick (and its wall-clock time) this epoch's state holds.
        self.tick = tick
        self.tick_time = tick_time
        self.dim = int(buffer.arrays["positions"].shape[1])
        self.ids = _read_only(buffer.arrays["ids"][:n])
        self.positions = _read_only(buffer.arrays["positions"][:n])
        self.columns: Mapping[str, np.ndarray] = MappingProxyType(
            {name: _read_only(buffer.arrays[name][:n]) for name in buffer.specs}
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
        wanted = _as_ids(ids, "ids")
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


def _as_ids(values: Any, what: str) -> np.ndarray:
    array = np.asarray(values)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1:
        raise UsageError(f"{what} must be one-dimensional, not of shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise UsageError(f"{what} must be integers, not {array.dtype}")
    if array.dtype.kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise UsageError(f"{what} must fit in int64")
    return array.astype(np.int64, copy=True)


class StateStore:
    """The double-buffered columnar state of one intermediary.

    ``dim`` (2 or 3) is fixed per store, as are the extra ``columns``. One writer (the
    upstream reader) calls :meth:`apply` and :meth:`end_epoch`; any number of threads call
    :meth:`snapshot`. Writers are serialised by a lock, and the swap is atomic with respect
    to :meth:`snapshot`: a snapshot is always of one whole epoch.
    """

    def __init__(
        self,
        dim: int,
        columns: Mapping[str, Column] | None = None,
        *,
        initial_capacity: int = 1024,
        max_entities: int = DEFAULT_MAX_ENTITIES,
    ) -> None:
        if dim not in (2, 3) or isinstance(dim, bool):
            raise UsageError(f"dim must be 2 or 3, not {dim!r}")
        specs = dict(columns or {})
        for name, spec in specs.items():
            if not isinstance(name, str) or not name.isidentifier() or name in _RESERVED:
                raise UsageError(
                    f"column name must be an identifier other than ids/positions, not {name!r}"
                )
            if not isinstance(spec, Column):
                raise UsageError(f"column {name!r} must be described by a Column, not {spec!r}")
        for what, value, top in (
            ("initial_capacity", initial_capacity, 1 << 26),
            ("max_entities", max_entities, 1 << 31),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise UsageError(f"{what} must be an int in 1..{top}, not {value!r}")
        self.dim = dim
        self.max_entities = max_entities
        self._specs: Mapping[str, Column] = MappingProxyType(specs)
        capacity = min(initial_capacity, max_entities)
        self._active = _Buffer(dim, self._specs, capacity)
        self._inert = _Buffer(dim, self._specs, capacity)
        self._epoch = 0
        self._tick = (0, 0.0)  # the active epoch's newest publisher tick and its time
        self._pending_tick = (0, 0.0)  # the same for the batches applied since
        self._log: list[_Ops] = []
        self._write_lock = threading.Lock()
        self._swap_lock = threading.Lock()
        #: Times a reader still held the old active buffer at a swap, so a copy was made.
        self.detached = 0

    @property
    def columns(self) -> Mapping[str, Column]:
        """The extra columns, by name."""
        return self._specs

    @property
    def epoch(self) -> int:
        """The epoch of the active buffer (0 before the first :meth:`end_epoch`)."""
        return self._epoch

    @property
    def pending(self) -> int:
        """Batches applied to the inert buffer and not yet visible (this epoch's log)."""
        return len(self._log)

    def snapshot(self) -> Snapshot:
        """The active state and its epoch, read-only and without a copy."""
        with self._swap_lock:
            return Snapshot(self._epoch, self._active, *self._tick)

    def apply(self, batch: UpdateBatch) -> None:
        """Validate ``batch`` and apply it to the inert buffer; it becomes visible at the next
        :meth:`end_epoch`. A refused batch (:class:`UsageError`) changes nothing."""
        with self._write_lock:
            ops = self._validate(batch)
            self._inert.apply(ops)
            self._log.append(ops)
            if batch.tick is not None and batch.tick >= self._pending_tick[0]:
                self._pending_tick = (batch.tick, batch.tick_time)

    def end_epoch(self, epoch: int | None = None) -> int:
        """Make this epoch's updates visible atomically and return the new epoch number:
        ``epoch`` if given (the publisher's tick; it must be greater than the current one),
        else the current one plus one.

        Readers of the old epoch keep it; the new inert buffer is then brought up to date,
        by re-applying the epoch's log or, if a reader still holds it, by a copy."""
        if epoch is not None and (
            isinstance(epoch, bool) or not isinstance(epoch, int) or epoch <= self._epoch
        ):
            raise UsageError(f"epoch must be an int > {self._epoch}, not {epoch!r}")
        with self._write_lock:
            with self._swap_lock:
                old_active = self._active
                self._active = self._inert
                self._epoch = self._epoch + 1 if epoch is None else epoch
                self._tick = self._pending_tick
                epoch = self._epoch
            # No snapshot of old_active can start any more; only earlier ones can hold it.
            if _in_use(old_active):
                self.detached += 1
                self._inert = self._active.copy()
            else:
                for ops in self._log:
                    old_active.apply(ops)
                self._inert = old_active
            self._log = []
            return epoch

    def buffers_converged(self) -> bool:
        """Tell whether the inert buffer holds what the active one does plus this epoch's
        pending batches (a self-check; True right after :meth:`end_epoch`)."""
        with self._write_lock:
            expected = self._active.copy()
            for ops in self._log:
                expected.apply(ops)
            return expected.same_as(self._inert)

    def _validate(self, batch: UpdateBatch) -> _Ops:
        if not isinstance(batch, UpdateBatch):
            raise UsageError(f"apply takes an UpdateBatch, not {type(batch).__name__}")
        tick, tick_time = batch.tick, batch.tick_time
        if tick is not None and (
            isinstance(tick, bool) or not isinstance(tick, int) or not 0 <= tick < 2**63
        ):
            raise UsageError(f"tick must be None or an int in [0, 2**63), not {tick!r}")
        if not isinstance(tick_time, (int, float)) or not (
            np.isfinite(tick_time) and tick_time >= 0
        ):
            raise UsageError(f"tick_time must be finite and >= 0, not {tick_time!r}")
        ids = _as_ids(batch.ids, "ids")
        deletes = np.unique(_as_ids(batch.delete, "delete"))
        n = len(ids)
        if batch.positions is None:
            if n:
                raise UsageError(f"the batch upserts {n} ids but has no positions")
            positions = np.zeros((0, self.dim))
        else:
            positions = _as_float(batch.positions, "positions", (n, self.dim), ids)
        unknown = set(batch.columns) - set(self._specs)
        if unknown:
            raise UsageError(
                f"unknown columns {sorted(map(str, unknown))}; "
                f"the store has {sorted(self._specs) or 'none'}"
            )
        columns: dict[str, np.ndarray] = {}
        for name, values in batch.columns.items():
            spec = self._specs[name]
            if spec.dtype == "float64":
                columns[name] = _as_float(values, f"column {name!r}", spec.shape(n), ids)
            else:
                columns[name] = _as_int(values, f"column {name!r}", spec.shape(n))
        if n:
            # The last occurrence of each id wins: unique over the reversed batch.
            unique_ids, first_in_reversed = np.unique(ids[::-1], return_index=True)
            pick = n - 1 - first_in_reversed
            ids = unique_ids
            positions = positions[pick]
            columns = {name: values[pick] for name, values in columns.items()}
        both = np.intersect1d(ids, deletes)
        if len(both):
            raise UsageError(f"id {int(both[0])} is both upserted and deleted in one batch")
        if len(ids):
            _, found = self._inert.rows_of(ids)
            total = self._inert.n + int(np.count_nonzero(~found))
            if total > self.max_entities:
                raise UsageError(
                    f"the batch would make {total} entities; this store holds at most "
                    f"{self.max_entities}"
                )
        return _Ops(ids=ids, positions=positions, columns=columns, delete=deletes)


def _as_float(values: Any, what: str, shape: tuple[int, ...], ids: np.ndarray) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype.kind not in "iuf":
        raise UsageError(f"{what} must be numbers, not {array.dtype}")
    if array.shape != shape:
        raise UsageError(f"{what} must have shape {shape}, not {array.shape}")
    array = array.astype(np.float64, copy=True)
    bad = ~np.isfinite(array)
    if bad.any():
        row = int(np.flatnonzero(bad.reshape(len(array), -1).any(axis=1))[0])
        raise UsageError(f"{what} of id {int(ids[row])} is not finite: {array[row].tolist()}")
    return array


def _as_int(values: Any, what: str, shape: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(values)
    if array.shape != shape:
        raise UsageError(f"{what} must have shape {shape}, not {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise UsageError(f"{what} must be integers, not {array.dtype}")
    return array.astype(np.int64, copy=True)
