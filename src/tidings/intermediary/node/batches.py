"""What upstream hands an intermediary's state store: :class:`UpdateBatch` es of upserts and
deletions, over the positions and the declared extra :class:`Column` s, and the checks that
turn a batch into the store's own arrays (:func:`validate`).

Batches: within one batch, an id given twice among the upserts takes its **last** values
(an upstream batch is a run of events in order, and the latest is the state); an id both
upserted and deleted in one batch is refused (the order would be a guess); deleting an id
that is not there is a no-op (deletes are idempotent, so a re-sent batch is harmless).
Positions and float columns must be finite; a refusal names the first offending id, and a
refused batch changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from tidings.errors import UsageError

ColumnDtype = Literal["float64", "int64"]


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
class ValidatedBatch:
    """A validated batch, in the store's own arrays: upserts sorted by id, unique."""

    ids: np.ndarray
    positions: np.ndarray
    columns: Mapping[str, np.ndarray]
    delete: np.ndarray


def validate(batch: UpdateBatch, dim: int, specs: Mapping[str, Column]) -> ValidatedBatch:
    """``batch`` checked against a store of ``dim`` with the extra columns ``specs``, in
    the store's own arrays; a refusal (:class:`UsageError`) names the first problem."""
    if not isinstance(batch, UpdateBatch):
        raise UsageError(f"apply takes an UpdateBatch, not {type(batch).__name__}")
    tick, tick_time = batch.tick, batch.tick_time
    if tick is not None and (
        isinstance(tick, bool) or not isinstance(tick, int) or not 0 <= tick < 2**63
    ):
        raise UsageError(f"tick must be None or an int in [0, 2**63), not {tick!r}")
    if not isinstance(tick_time, (int, float)) or not (np.isfinite(tick_time) and tick_time >= 0):
        raise UsageError(f"tick_time must be finite and >= 0, not {tick_time!r}")
    ids = as_ids(batch.ids, "ids")
    deletes = np.unique(as_ids(batch.delete, "delete"))
    n = len(ids)
    if batch.positions is None:
        if n:
            raise UsageError(f"the batch upserts {n} ids but has no positions")
        positions = np.zeros((0, dim))
    else:
        positions = _as_float(batch.positions, "positions", (n, dim), ids)
    unknown = set(batch.columns) - set(specs)
    if unknown:
        raise UsageError(
            f"unknown columns {sorted(map(str, unknown))}; the store has {sorted(specs) or 'none'}"
        )
    columns: dict[str, np.ndarray] = {}
    for name, values in batch.columns.items():
        spec = specs[name]
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
    return ValidatedBatch(ids=ids, positions=positions, columns=columns, delete=deletes)


def as_ids(values: Any, what: str) -> np.ndarray:
    """``values`` as a new one-dimensional int64 array of ids, or a refusal naming ``what``."""
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
