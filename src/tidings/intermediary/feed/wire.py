"""The spatial feed's wire protocol: a publisher of moving entities and the intermediaries
that subscribe to it from other processes (the patent's intermediaries are separate
machines, Fig. 3). Both sides speak it: the intermediary's
(:mod:`.remote`) and the demo publisher's (:mod:`tidings.intermediary.publisher.server`).

One WebSocket connection per intermediary. The intermediary sends JSON text messages, in
order, with the :class:`~tidings.intermediary.node.intermediary.Upstream` operations:

* ``{"op": "subscribe", "boxes": [{"lo": [x, y], "hi": [x, y]}, ...]}``
* ``{"op": "unsubscribe", "boxes": [...]}`` (one occurrence of each; the boxes are a multiset)
* ``{"op": "follow", "entities": [id, ...]}`` (int64 ids, replacing the set followed)

The publisher sends one binary message per tick (:func:`encode_batch`): a 40-byte header
``<4sBBHQQdII`` (magic ``TSFB``, version 1, dimension, reserved, tick u64, *applied* u64:
how many of the intermediary's operations the batch reflects, the tick's wall-clock time
f64, ``n`` upserts, ``m`` deletions) then ``n`` int64 ids, ``n * dim`` float64 positions and
``m`` int64 deleted ids, little-endian: the intermediary's state holds exactly what its
boxes (and followed entities) cover. Why *applied*: an operation reaches the publisher a
tick or more after the intermediary sent it, so a new subscription's part of the world is
not in the next batch; the intermediary does not serve a view until the batches reflect
the operation its subscription needed
(:func:`~tidings.intermediary.node.intermediary.requests_of`), rather than serve it from
state that lacks part of it. A malformed message or a refused operation closes the
connection with code 1008 and a reason naming the problem; the publisher goes on serving
the others.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from tidings.errors import IntermediaryError
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.regions.geometry import Box

HEADER = struct.Struct("<4sBBHQQdII")
MAGIC = b"TSFB"
VERSION = 1
#: The close code of a refused operation or a malformed message (policy violation).
POLICY_CLOSE_CODE = 1008
#: The largest control message an intermediary may send (a full box set fits easily).
MAX_CONTROL_BYTES = 1 << 20
#: The most entities one connection may follow.
MAX_FOLLOWED = 100_000
#: The most boxes one feed may hold at the publisher (an intermediary keeps far fewer).
MAX_FEED_BOXES = 4096


def encode_batch(batch: UpdateBatch, dim: int, applied: int = 0) -> bytes:
    """One tick's binary message (see the module docstring); ``applied``: the operations of
    the intermediary the batch reflects."""
    ids = np.ascontiguousarray(batch.ids, dtype="<i8")
    positions = np.ascontiguousarray(
        np.empty((0, dim)) if batch.positions is None else batch.positions, dtype="<f8"
    )
    delete = np.ascontiguousarray(batch.delete, dtype="<i8")
    if positions.shape != (len(ids), dim):
        raise IntermediaryError(
            f"feed: {len(ids)} ids need positions of shape ({len(ids)}, {dim}), "
            f"not {positions.shape}"
        )
    tick = 0 if batch.tick is None else batch.tick
    for name, value in (("tick", tick), ("applied", applied)):
        if not 0 <= value < 2**64:
            raise IntermediaryError(f"feed: a batch's {name} must be in [0, 2**64), not {value}")
    if not math.isfinite(batch.tick_time):
        raise IntermediaryError("feed: a batch's tick time must be finite")
    head = HEADER.pack(
        MAGIC, VERSION, dim, 0, tick, applied, batch.tick_time, len(ids), len(delete)
    )
    return b"".join((head, ids.tobytes(), positions.tobytes(), delete.tobytes()))


def decode_batch(data: bytes, dim: int) -> tuple[UpdateBatch, int]:
    """The :class:`UpdateBatch` of one tick's message and the operations it reflects; a
    malformed one is an error naming what is wrong."""
    if len(data) < HEADER.size:
        raise IntermediaryError(f"feed: a batch of {len(data)} bytes is shorter than its header")
    magic, version, got_dim, _, tick, applied, tick_time, n, m = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise IntermediaryError(f"feed: not a version {VERSION} batch ({magic!r} v{version})")
    if got_dim != dim:
        raise IntermediaryError(f"feed: a {got_dim}D batch for a {dim}D intermediary")
    if len(data) != HEADER.size + 8 * (n + n * dim + m):
        raise IntermediaryError(
            f"feed: a batch of {n} upserts and {m} deletions cannot be {len(data)} bytes"
        )
    if not math.isfinite(tick_time):
        raise IntermediaryError("feed: a batch's tick time must be finite")
    at = HEADER.size
    ids = np.frombuffer(data, dtype="<i8", count=n, offset=at)
    positions = np.frombuffer(data, dtype="<f8", count=n * dim, offset=at + 8 * n)
    delete = np.frombuffer(data, dtype="<i8", count=m, offset=at + 8 * (n + n * dim))
    batch = UpdateBatch(
        ids=ids.astype(np.int64),
        positions=positions.reshape(n, dim).astype(np.float64),
        delete=delete.astype(np.int64),
        tick=int(tick),
        tick_time=float(tick_time),
    )
    return batch, int(applied)


def boxes_of(message: dict[str, Any], dim: int) -> list[Box]:
    """The boxes of a ``subscribe`` or ``unsubscribe`` message, each of dimension ``dim``."""
    boxes = message.get("boxes")
    if not isinstance(boxes, list):
        raise IntermediaryError(f"feed: {message.get('op')}: 'boxes' must be a list")
    out = []
    for spec in boxes:
        if not isinstance(spec, dict) or set(spec) != {"lo", "hi"}:
            raise IntermediaryError("feed: a box is {'lo': [...], 'hi': [...]}")
        box = Box(spec["lo"], spec["hi"])
        if box.dim != dim:
            raise IntermediaryError(f"feed: expected {dim}D boxes, got {box.dim}D")
        out.append(box)
    return out


def entities_of(message: dict[str, Any]) -> frozenset[int]:
    """The entity ids of a ``follow`` message."""
    entities = message.get("entities")
    if not isinstance(entities, list) or len(entities) > MAX_FOLLOWED:
        raise IntermediaryError(f"feed: follow: 'entities' must be a list of <= {MAX_FOLLOWED}")
    if not all(type(e) is int and -(2**63) <= e < 2**63 for e in entities):
        raise IntermediaryError("feed: follow: entities must be int64 ids")
    return frozenset(entities)


def box_spec(box: Box) -> dict[str, list[float]]:
    """A box as the control messages carry it."""
    return {"lo": list(box.lo), "hi": list(box.hi)}


def close_reason(exc: Exception) -> str:
    """``exc``'s message cut to what a close frame carries (123 bytes of UTF-8)."""
    return str(exc).encode()[:120].decode(errors="ignore")
