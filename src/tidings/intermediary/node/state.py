"""The state store of an intermediary: columnar, double-buffered ([147]-[151], Figs. 10a-b).

An intermediary keeps the state its subscribers' views are generated from (agents of a
simulation, the latest value of event types). Generation must never see a half-applied
epoch, while updates keep arriving from upstream, so the store holds two copies:

* the **active** buffer, which generation reads through :meth:`StateStore.snapshot`;
* the **inert** buffer, which :meth:`StateStore.apply` writes (step 1070a).

:meth:`StateStore.end_epoch` swaps them atomically with respect to :meth:`snapshot` (1070c)
and then brings the new inert buffer up to date by re-applying the epoch's update log
(1070d), so both converge. Each buffer is columnar (:mod:`.buffers`); batches are checked as
:mod:`.batches` says.

Why readers stay consistent across a swap: a snapshot (:mod:`.snapshot`) holds read-only
*views* of the active buffer's arrays, and a numpy view keeps a reference to the array it
views. When an epoch ends, the buffer that was active becomes the inert one and would be
written next; if any view of it is still alive (a generation round that began before the
swap, or an array a reader kept from a snapshot), the store does not write into it: it
leaves it to those readers and makes a fresh inert buffer by copying the new active one
("detaching", counted in :attr:`StateStore.detached`). The upstream writer therefore never
waits for a slow reader, and a reader never sees its snapshot change. Memory is two buffers
plus one per epoch that a reader still holds a snapshot of; a reader that drops its
snapshot after each generation round keeps it at two.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from tidings.errors import UsageError
from tidings.intermediary.node.batches import Column, UpdateBatch, ValidatedBatch, validate
from tidings.intermediary.node.buffers import Buffer, in_use
from tidings.intermediary.node.snapshot import Snapshot

#: Names the store uses itself; extra columns may not take them.
_RESERVED = frozenset({"ids", "positions"})
#: Default bound on the number of entities one store may hold (bounded memory).
DEFAULT_MAX_ENTITIES = 10_000_000


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
        self._active = Buffer(dim, self._specs, capacity)
        self._inert = Buffer(dim, self._specs, capacity)
        self._epoch = 0
        self._tick = (0, 0.0)  # the active epoch's newest publisher tick and its time
        self._pending_tick = (0, 0.0)  # the same for the batches applied since
        self._log: list[ValidatedBatch] = []
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
            if in_use(old_active):
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

    def _validate(self, batch: UpdateBatch) -> ValidatedBatch:
        ops = validate(batch, self.dim, self._specs)
        if len(ops.ids):
            _, found = self._inert.rows_of(ops.ids)
            total = self._inert.n + int(np.count_nonzero(~found))
            if total > self.max_entities:
                raise UsageError(
                    f"the batch would make {total} entities; this store holds at most "
                    f"{self.max_entities}"
                )
        return ops
