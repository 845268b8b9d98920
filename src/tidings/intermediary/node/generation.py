"""Generating one subscriber's view from the active state, as a binary frame ([89]-[93],
[139], claims 5-6).

A view is generated from the intermediary's own state, never by asking the publisher
([139]): the rows of a :class:`~tidings.intermediary.node.snapshot.Snapshot` whose positions the
subscriber's (resolved) region contains are selected with **one** vectorised ``contains``
call, transformed to what the subscriber declared it can take (:class:`Capabilities`:
single precision, coordinates relative to its own entity, zlib compression, a cap on the
number of entities, [91]-[93]) and packed into a binary frame with numpy ``tobytes`` and
:mod:`struct` -- no Python work per entity, so 50,000 entities cost a few array passes.

Frame layout (all little-endian; :data:`HEADER` is the fixed part):

======  ====  =========  ==============================================================
offset  size  field      meaning
======  ====  =========  ==============================================================
0       4     magic      ``b"TDGF"``
4       1     version    2 (version 1 had no tick fields: 20-byte header)
5       1     kind       1 = VIEW (entities follow), 2 = EMPTY (the view is empty, [139]),
                         3 = UNCHANGED (same ids and positions as this subscriber's
                         previous frame)
6       8     epoch      u64, the state epoch the frame was generated from
14      4     count      u32, entities in the frame (0 for EMPTY and UNCHANGED)
18      1     dim        2 or 3
19      1     flags      bit 0 float32 positions (else float64), bit 1 relative
                         coordinates, bit 2 zlib-compressed payload, bit 3 truncated to
                         the subscriber's ``max_entities``; other bits must be 0
20      8     tick       u64, the newest publisher tick the epoch's state holds (0: none)
28      8     tick_time  f64, the publisher's wall-clock time of that tick (Unix seconds;
                         0: unknown); staleness = receipt time - tick_time
36      8*dim origin     only with the relative flag: the float64 position the
                         coordinates are relative to (the subscriber's own entity)
..      ..    payload    ``count`` ids (int64), then ``count * dim`` positions (float32 or
                         float64, row-major); the whole payload zlib-compressed when
                         flag bit 2 is set
======  ====  =========  ==============================================================

EMPTY and UNCHANGED frames carry no origin and no payload: 36 bytes (with the tick, so
a still scene still tells its staleness). Ids are ascending (the
state store's order). When the selection exceeds ``max_entities``, the entities nearest to
the subscriber's own position (or to the middle of its region) are kept, and the frame says
so (flag bit 3) rather than silently cutting.

"Same as last": the frame carries a digest (BLAKE2b over the kind, the flags but
compression, the origin and the uncompressed payload: the content, not its encoding).
:class:`LastFrames` keeps one digest per subscriber (bounded) and turns a frame whose digest
equals that subscriber's previous one into UNCHANGED, so a still scene costs 20 bytes a
push.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from tidings.errors import IntermediaryError
from tidings.intermediary.node.snapshot import Snapshot
from tidings.intermediary.regions.geometry import Box, Region, Relative, Sector, Sphere

MAGIC = b"TDGF"
VERSION = 2
#: The fixed header: magic, version, kind, epoch, count, dim, flags, tick, tick_time.
HEADER = struct.Struct("<4sBBQIBBQd")

FLAG_FLOAT32 = 0x01
FLAG_RELATIVE = 0x02
FLAG_COMPRESSED = 0x04
FLAG_TRUNCATED = 0x08
_KNOWN_FLAGS = FLAG_FLOAT32 | FLAG_RELATIVE | FLAG_COMPRESSED | FLAG_TRUNCATED

#: The largest ``max_entities`` a subscriber may declare (a frame's count is a u32, and a
#: bound keeps one frame's memory sane: 10 million entities in 3D float64 is 320 MB).
MAX_ENTITIES_CAP = 10_000_000
#: zlib level: 1 is several times faster than the default for little less compression of
#: float data, and generation runs per subscriber per tick.
ZLIB_LEVEL = 1


class FrameKind(IntEnum):
    """What a frame says."""

    VIEW = 1
    EMPTY = 2
    UNCHANGED = 3


@dataclass(frozen=True)
class Capabilities:
    """What a subscriber declared it can take ([93]).

    ``float32``: positions in single precision (half the bytes; exact enough for a view,
    especially with ``relative``). ``relative``: coordinates relative to the subscriber's own
    entity ([92]). ``compress``: zlib the payload. ``max_entities``: the most entities one
    frame may hold.
    """

    float32: bool = False
    relative: bool = False
    compress: bool = False
    max_entities: int = 100_000

    def __post_init__(self) -> None:
        for name in ("float32", "relative", "compress"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise IntermediaryError(
                    f"capabilities.{name}: expected true or false, got {value!r:.40}"
                )
        cap = self.max_entities
        if isinstance(cap, bool) or not isinstance(cap, int):
            raise IntermediaryError(
                f"capabilities.max_entities: expected an integer, got {cap!r:.40}"
            )
        if not 1 <= cap <= MAX_ENTITIES_CAP:
            raise IntermediaryError(
                f"capabilities.max_entities: must be in 1..{MAX_ENTITIES_CAP}, got {cap}"
            )

    @classmethod
    def parse(cls, spec: object) -> Capabilities:
        """Capabilities from what a subscriber sends, e.g. ``{"float32": true}``; missing
        keys take the defaults, unknown keys are refused (a typo is not ignored)."""
        if spec is None:
            return cls()
        if not isinstance(spec, Mapping):
            raise IntermediaryError(f"capabilities: expected an object, got {type(spec).__name__}")
        known = ("float32", "relative", "compress", "max_entities")
        unknown = sorted(str(key) for key in spec if key not in known)
        if unknown:
            raise IntermediaryError(
                f"capabilities.{unknown[0]}: unknown (expected {', '.join(known)})"
            )
        return cls(**{str(key): value for key, value in spec.items()})

    @property
    def flags(self) -> int:
        """The frame flags these capabilities set (truncation is decided per frame)."""
        return (
            (FLAG_FLOAT32 if self.float32 else 0)
            | (FLAG_RELATIVE if self.relative else 0)
            | (FLAG_COMPRESSED if self.compress else 0)
        )


@dataclass(frozen=True)
class FrameHeader:
    """The decoded fixed header (and the origin, for relative frames)."""

    kind: FrameKind
    epoch: int
    count: int
    dim: int
    flags: int
    origin: tuple[float, ...] | None = None
    tick: int = 0
    tick_time: float = 0.0

    @property
    def float32(self) -> bool:
        return bool(self.flags & FLAG_FLOAT32)

    @property
    def relative(self) -> bool:
        return bool(self.flags & FLAG_RELATIVE)

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_COMPRESSED)

    @property
    def truncated(self) -> bool:
        return bool(self.flags & FLAG_TRUNCATED)


@dataclass(frozen=True)
class Frame:
    """A generated frame: its wire bytes, and what was in it (for the caller's bookkeeping:
    the digest for "same as last", the count for metrics)."""

    kind: FrameKind
    epoch: int
    count: int
    data: bytes
    digest: bytes
    tick: int = 0
    tick_time: float = 0.0

    def __len__(self) -> int:
        return len(self.data)


def _header(
    kind: FrameKind, epoch: int, count: int, dim: int, flags: int, tick: int, tick_time: float
) -> bytes:
    return HEADER.pack(MAGIC, VERSION, int(kind), epoch, count, dim, flags, tick, tick_time)


def empty_frame(epoch: int, dim: int, tick: int = 0, tick_time: float = 0.0) -> Frame:
    """The explicit "the view is empty" frame ([139])."""
    data = _header(FrameKind.EMPTY, epoch, 0, dim, 0, tick, tick_time)
    digest = _digest(FrameKind.EMPTY, 0, b"", b"")
    return Frame(FrameKind.EMPTY, epoch, 0, data, digest, tick, tick_time)


def unchanged_frame(epoch: int, dim: int, tick: int = 0, tick_time: float = 0.0) -> Frame:
    """The "same as your previous frame" frame; its digest is that previous frame's."""
    data = _header(FrameKind.UNCHANGED, epoch, 0, dim, 0, tick, tick_time)
    return Frame(FrameKind.UNCHANGED, epoch, 0, data, b"", tick, tick_time)


def _digest(kind: FrameKind, flags: int, origin: bytes, payload: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(bytes((int(kind), flags & ~FLAG_COMPRESSED)))
    h.update(origin)
    h.update(payload)
    return h.digest()


def checked_own(own_position: Sequence[float] | np.ndarray | None, dim: int) -> np.ndarray | None:
    """The subscriber's own position as float64 coordinates, or a refusal naming why."""
    if own_position is None:
        return None
    array = np.asarray(own_position, dtype=np.float64)
    if array.shape != (dim,):
        raise IntermediaryError(
            f"own_position: expected {dim} coordinates, got an array of shape {array.shape}"
        )
    if not np.all(np.isfinite(array)):
        raise IntermediaryError(f"own_position: must be finite, got {array.tolist()}")
    return array


def _middle(region: Region) -> np.ndarray:
    if isinstance(region, (Sphere, Sector)):
        return np.array(region.center)
    box: Box = region.bounds()
    middle: np.ndarray = (np.array(box.lo) + np.array(box.hi)) / 2
    return middle


def generate(
    snapshot: Snapshot,
    region: Region,
    caps: Capabilities,
    own_position: Sequence[float] | np.ndarray | None = None,
    candidates: np.ndarray | None = None,
) -> Frame:
    """The frame of ``region``'s view of ``snapshot``, shaped by ``caps`` ([89]-[93]).

    ``candidates``, if given, are the ascending rows that may lie in the region (a superset,
    e.g. from a :class:`.grid.GridIndex` of this snapshot): only they are tested.

    ``region`` is already resolved (a :class:`Relative` one is placed with
    :meth:`Relative.resolve` first). ``own_position`` is the subscriber's own entity's
    position; it is required when ``caps.relative`` is set, and it picks which entities are
    kept when the selection exceeds ``caps.max_entities`` (the nearest). An empty selection
    gives the EMPTY frame.
    """
    if isinstance(region, Relative):
        raise IntermediaryError(
            "region: a relative region is placed first (Relative.resolve at its entity's "
            "position); a view is generated for where it is now"
        )
    if not isinstance(region, (Box, Sphere, Sector)):
        raise IntermediaryError(f"region: expected a region, got {type(region).__name__}")
    if not isinstance(caps, Capabilities):
        raise IntermediaryError(f"capabilities: expected Capabilities, got {type(caps).__name__}")
    dim = snapshot.dim
    if region.dim != dim:
        raise IntermediaryError(f"region: has {region.dim} dimensions, the state has {dim}")
    own = checked_own(own_position, dim)
    if caps.relative and own is None:
        raise IntermediaryError(
            "own_position: the subscriber asked for relative coordinates, but its own "
            "entity's position is not known"
        )
    epoch = int(snapshot.epoch)
    if candidates is None:
        rows = np.flatnonzero(region.contains(snapshot.positions))
    else:
        rows = candidates[region.contains(snapshot.positions[candidates])]
    tick, tick_time = int(snapshot.tick), float(snapshot.tick_time)
    if rows.size == 0:
        return empty_frame(epoch, dim, tick, tick_time)
    flags = caps.flags
    if rows.size > caps.max_entities:
        reference = own if own is not None else _middle(region)
        offsets = snapshot.positions[rows] - reference
        distance = np.einsum("ij,ij->i", offsets, offsets)
        nearest = np.argpartition(distance, caps.max_entities - 1)[: caps.max_entities]
        rows = np.sort(rows[nearest])
        flags |= FLAG_TRUNCATED
    return view_frame(snapshot, snapshot.ids[rows], snapshot.positions[rows], caps, own, flags)


def view_frame(
    snapshot: Snapshot,
    ids: np.ndarray,
    positions: np.ndarray,
    caps: Capabilities,
    own: np.ndarray | None,
    flags: int,
) -> Frame:
    """The VIEW frame of the selected (non-empty) ``ids`` and their float64 ``positions``,
    encoded as ``caps`` say; ``own`` is required for relative coordinates. Shared by
    :func:`generate` and the round-at-once path (:mod:`.roundgen`), so both encode alike."""
    epoch, dim = int(snapshot.epoch), snapshot.dim
    tick, tick_time = int(snapshot.tick), float(snapshot.tick_time)
    ids = ids.astype("<i8", copy=False)
    origin = b""
    if caps.relative:
        assert own is not None
        positions = positions - own
        origin = own.astype("<f8").tobytes()
    positions = positions.astype("<f4" if caps.float32 else "<f8", copy=False)
    payload = ids.tobytes() + np.ascontiguousarray(positions).tobytes()
    digest = _digest(FrameKind.VIEW, flags, origin, payload)
    if caps.compress:
        payload = zlib.compress(payload, ZLIB_LEVEL)
    count = len(ids)
    header = _header(FrameKind.VIEW, epoch, count, dim, flags, tick, tick_time)
    data = b"".join((header, origin, payload))
    return Frame(FrameKind.VIEW, epoch, count, data, digest, tick, tick_time)


class LastFrames:
    """One digest per subscriber, to send UNCHANGED instead of a view equal to the previous
    one. Bounded: past ``max_subscribers`` the least recently served subscriber is forgotten
    (it just gets a full frame next time), so a flood of short-lived subscribers cannot grow
    it; :meth:`forget` drops a subscriber that left."""

    def __init__(self, max_subscribers: int = 100_000) -> None:
        if (
            isinstance(max_subscribers, bool)
            or not isinstance(max_subscribers, int)
            or max_subscribers < 1
        ):
            raise IntermediaryError(
                f"max_subscribers: expected an integer >= 1, got {max_subscribers!r}"
            )
        self.max_subscribers = max_subscribers
        self._last: OrderedDict[Hashable, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def forget(self, subscriber_id: Hashable) -> None:
        self._last.pop(subscriber_id, None)

    def filter(self, subscriber_id: Hashable, frame: Frame) -> Frame:
        """``frame``, or UNCHANGED if it holds what this subscriber's previous frame did.

        An EMPTY frame is kept as it is (it is already as small), and also recorded, so the
        view that follows an empty one is always sent in full. Call it only for frames that
        are actually sent: the digest recorded is what the subscriber has.
        """
        if frame.kind is FrameKind.UNCHANGED:
            return frame
        previous = self._last.get(subscriber_id)
        self._last[subscriber_id] = frame.digest
        self._last.move_to_end(subscriber_id)
        while len(self._last) > self.max_subscribers:
            self._last.popitem(last=False)
        if frame.kind is FrameKind.VIEW and previous == frame.digest:
            header = HEADER.unpack_from(frame.data)
            return unchanged_frame(frame.epoch, header[5], frame.tick, frame.tick_time)
        return frame


def decode_frame(data: bytes) -> tuple[FrameHeader, np.ndarray, np.ndarray]:
    """Parse a frame: its header, the ids (int64, ``[count]``) and the positions (float32 or
    float64 as sent, ``[count, dim]``; relative ones as sent, add ``header.origin`` for world
    coordinates). EMPTY and UNCHANGED frames give empty arrays.

    A frame that is truncated, garbled or of an unknown version is refused with an
    :class:`IntermediaryError` naming what is wrong; decompression is bounded by the size the
    header announces, so a small frame cannot expand into a huge one.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise IntermediaryError(f"frame: expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < HEADER.size:
        raise IntermediaryError(
            f"frame: truncated header ({len(data)} bytes, a header has {HEADER.size})"
        )
    magic, version, kind_value, epoch, count, dim, flags, tick, tick_time = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise IntermediaryError(f"frame: bad magic {magic!r} (expected {MAGIC!r})")
    if version != VERSION:
        raise IntermediaryError(f"frame: unsupported version {version} (this reads {VERSION})")
    try:
        kind = FrameKind(kind_value)
    except ValueError:
        raise IntermediaryError(f"frame: unknown kind {kind_value}") from None
    if dim not in (2, 3):
        raise IntermediaryError(f"frame: dim must be 2 or 3, got {dim}")
    if flags & ~_KNOWN_FLAGS:
        raise IntermediaryError(f"frame: unknown flag bits 0x{flags & ~_KNOWN_FLAGS:02x}")
    float_type = np.dtype("<f4" if flags & FLAG_FLOAT32 else "<f8")
    if kind is not FrameKind.VIEW:
        if count or flags or len(data) != HEADER.size:
            raise IntermediaryError(
                f"frame: a {kind.name} frame has no entities, flags or payload "
                f"(count {count}, flags 0x{flags:02x}, {len(data)} bytes)"
            )
        header = FrameHeader(kind, epoch, 0, dim, 0, None, tick, tick_time)
        return header, np.zeros(0, np.int64), np.zeros((0, dim), float_type)
    if count == 0:
        raise IntermediaryError("frame: a VIEW frame with 0 entities (an empty view is EMPTY)")
    offset = HEADER.size
    origin: tuple[float, ...] | None = None
    if flags & FLAG_RELATIVE:
        end = offset + 8 * dim
        if len(data) < end:
            raise IntermediaryError(
                f"frame: truncated origin ({len(data) - offset} of {8 * dim} bytes)"
            )
        origin_array = np.frombuffer(data, "<f8", dim, offset)
        if not np.all(np.isfinite(origin_array)):
            raise IntermediaryError(f"frame: origin is not finite: {origin_array.tolist()}")
        origin = tuple(origin_array.tolist())
        offset = end
    expected = count * 8 + count * dim * float_type.itemsize
    payload = data[offset:]
    if flags & FLAG_COMPRESSED:
        inflater = zlib.decompressobj()
        try:
            payload = inflater.decompress(payload, expected + 1)
        except zlib.error as exc:
            raise IntermediaryError(f"frame: corrupt compressed payload ({exc})") from None
        if len(payload) > expected or inflater.unused_data:
            raise IntermediaryError(
                f"frame: compressed payload holds more than the {expected} bytes "
                f"{count} entities take"
            )
        if not inflater.eof:
            raise IntermediaryError(
                f"frame: truncated compressed payload ({len(payload)} of {expected} bytes)"
            )
    if len(payload) != expected:
        what = "truncated" if len(payload) < expected else "overlong"
        raise IntermediaryError(
            f"frame: {what} payload ({len(payload)} bytes; {count} entities in {dim}D "
            f"take {expected})"
        )
    ids = np.frombuffer(payload, "<i8", count, 0).astype(np.int64)
    positions = np.frombuffer(payload, float_type, count * dim, count * 8).reshape(count, dim)
    if not np.all(np.isfinite(positions)):
        raise IntermediaryError("frame: positions hold a non-finite number")
    header = FrameHeader(kind, epoch, count, dim, flags, origin, tick, tick_time)
    return header, ids, positions.copy()


__all__ = [
    "HEADER",
    "MAX_ENTITIES_CAP",
    "Capabilities",
    "Frame",
    "FrameHeader",
    "FrameKind",
    "LastFrames",
    "decode_frame",
    "empty_frame",
    "generate",
    "unchanged_frame",
]
