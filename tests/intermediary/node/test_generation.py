"""Generation of per-subscriber binary frames from the active state ([89]-[93], [139])."""

from __future__ import annotations

import math
import struct
import zlib
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.errors import IntermediaryError
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.generation import (
    HEADER,
    MAX_ENTITIES_CAP,
    Capabilities,
    FrameKind,
    LastFrames,
    decode_frame,
    generate,
)
from tidings.intermediary.node.snapshot import Snapshot
from tidings.intermediary.node.state import StateStore
from tidings.intermediary.regions.geometry import Box, Region, Relative, Sector, Sphere


def _snapshot(positions: np.ndarray, ids: np.ndarray | None = None) -> Snapshot:
    store = StateStore(positions.shape[1], initial_capacity=max(1, len(positions)))
    if ids is None:
        ids = np.arange(len(positions), dtype=np.int64) * 3 + 5
    store.apply(UpdateBatch(ids=ids, positions=positions))
    store.end_epoch()
    return store.snapshot()


def _brute_force(region: Region, ids: np.ndarray, positions: np.ndarray) -> list[int]:
    """Per entity, by the definition of each region (no vectorised contains for box and
    sphere; a sector is asked point by point)."""
    chosen = []
    for entity, point in zip(ids.tolist(), positions.tolist(), strict=True):
        if isinstance(region, Box):
            inside = all(
                lo <= x <= hi for lo, x, hi in zip(region.lo, point, region.hi, strict=True)
            )
        elif isinstance(region, Sphere):
            inside = math.dist(point, region.center) <= region.radius
        else:
            inside = bool(region.contains(np.array([point]))[0])
        if inside:
            chosen.append(entity)
    return sorted(chosen)


def _regions(dim: int) -> list[Region]:
    c = (50.0,) * dim
    return [
        Box((20.0,) * dim, (70.0,) * dim),
        Sphere(c, 30.0),
        Sector(c, 40.0, (1.0,) + (0.0,) * (dim - 1), math.pi / 3),
    ]


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("float32", [False, True])
@pytest.mark.parametrize("relative", [False, True])
@pytest.mark.parametrize("compress", [False, True])
def test_round_trip_matches_brute_force(
    dim: int, float32: bool, relative: bool, compress: bool
) -> None:
    rng = np.random.default_rng(dim * 8 + float32 * 4 + relative * 2 + compress)
    positions = rng.uniform(0, 100, size=(2000, dim))
    snap = _snapshot(positions)
    own = rng.uniform(0, 100, size=dim)
    caps = Capabilities(float32=float32, relative=relative, compress=compress)
    for region in _regions(dim):
        frame = generate(snap, region, caps, own_position=own if relative else None)
        header, ids, got = decode_frame(frame.data)
        expected_ids = _brute_force(region, np.asarray(snap.ids), positions[snap.rows_of(snap.ids)])
        assert frame.kind is FrameKind.VIEW and header.kind is FrameKind.VIEW
        assert header.epoch == snap.epoch == 1
        assert header.count == frame.count == len(expected_ids) > 0
        assert header.dim == dim
        assert (header.float32, header.relative, header.compressed) == (float32, relative, compress)
        assert not header.truncated
        assert ids.tolist() == expected_ids
        assert got.dtype == (np.float32 if float32 else np.float64)
        assert got.shape == (len(expected_ids), dim)
        world = positions[snap.rows_of(ids)]
        if relative:
            assert header.origin == tuple(own.tolist())
            back = got.astype(np.float64) + np.array(header.origin)
        else:
            assert header.origin is None
            back = got.astype(np.float64)
        if float32:
            # Single precision of the (relative) coordinates, not of the world ones.
            scale = np.abs(world - (own if relative else 0)).max()
            np.testing.assert_allclose(back, world, rtol=0, atol=scale * 2**-23 * 2)
        else:
            np.testing.assert_allclose(back, world, rtol=0, atol=1e-12 * 100)


def test_compressed_and_float32_frames_are_smaller() -> None:
    positions = np.round(np.random.default_rng(1).uniform(0, 100, size=(5000, 3)))
    snap = _snapshot(positions)
    region = Box((0.0,) * 3, (100.0,) * 3)
    plain = generate(snap, region, Capabilities())
    single = generate(snap, region, Capabilities(float32=True))
    packed = generate(snap, region, Capabilities(compress=True))
    assert len(plain) == HEADER.size + 5000 * 8 + 5000 * 3 * 8
    assert len(single) == HEADER.size + 5000 * 8 + 5000 * 3 * 4
    assert len(packed) < len(plain)
    assert plain.digest == packed.digest  # same content, different encoding


def test_empty_view_frame() -> None:
    snap = _snapshot(np.random.default_rng(2).uniform(0, 10, size=(100, 3)))
    frame = generate(snap, Sphere((500.0, 500.0, 500.0), 5.0), Capabilities(compress=True))
    assert frame.kind is FrameKind.EMPTY
    assert len(frame) == HEADER.size
    header, ids, positions = decode_frame(frame.data)
    assert header.kind is FrameKind.EMPTY and header.count == 0 and header.epoch == 1
    assert ids.shape == (0,) and positions.shape == (0, 3)
    # An empty state gives the empty view too.
    empty = StateStore(2).snapshot()
    assert generate(empty, Box((0.0, 0.0), (1.0, 1.0)), Capabilities()).kind is FrameKind.EMPTY


def test_unchanged_frame_when_nothing_moved() -> None:
    store = StateStore(2)
    rng = np.random.default_rng(3)
    store.apply(UpdateBatch(ids=np.arange(50), positions=rng.uniform(0, 10, size=(50, 2))))
    store.end_epoch()
    region = Box((0.0, 0.0), (5.0, 5.0))
    caps = Capabilities(compress=True)
    last = LastFrames()
    first = last.filter("a", generate(store.snapshot(), region, caps))
    assert first.kind is FrameKind.VIEW
    # A new epoch that moves only entities outside the region: the view is the same.
    outside = [i for i, p in enumerate(store.snapshot().positions) if not (p <= 5).all()]
    store.apply(UpdateBatch(ids=outside[:3], positions=np.full((3, 2), 9.5)))
    store.end_epoch()
    second = last.filter("a", generate(store.snapshot(), region, caps))
    assert second.kind is FrameKind.UNCHANGED and second.epoch == 2
    header, ids, positions = decode_frame(second.data)
    assert header.kind is FrameKind.UNCHANGED and len(ids) == 0 and positions.shape == (0, 2)
    # Another subscriber has not seen it yet: it gets the full view.
    assert last.filter("b", generate(store.snapshot(), region, caps)).kind is FrameKind.VIEW
    # A move inside the region changes the view.
    inside = [i for i, p in enumerate(store.snapshot().positions) if (p <= 5).all()]
    store.apply(UpdateBatch(ids=inside[:1], positions=[[1.25, 1.5]]))
    store.end_epoch()
    assert last.filter("a", generate(store.snapshot(), region, caps)).kind is FrameKind.VIEW
    # Relative coordinates change when the subscriber itself moves, so the view does.
    snap = store.snapshot()
    rel = Capabilities(relative=True)
    assert last.filter("r", generate(snap, region, rel, (1.0, 1.0))).kind is FrameKind.VIEW
    assert last.filter("r", generate(snap, region, rel, (1.0, 1.0))).kind is FrameKind.UNCHANGED
    assert last.filter("r", generate(snap, region, rel, (2.0, 1.0))).kind is FrameKind.VIEW


def test_after_an_empty_view_the_next_view_is_sent_in_full() -> None:
    snap = _snapshot(np.array([[1.0, 1.0], [2.0, 2.0]]))
    last = LastFrames()
    box = Box((0.0, 0.0), (3.0, 3.0))
    far = Box((10.0, 10.0), (11.0, 11.0))
    assert last.filter("a", generate(snap, box, Capabilities())).kind is FrameKind.VIEW
    assert last.filter("a", generate(snap, far, Capabilities())).kind is FrameKind.EMPTY
    assert last.filter("a", generate(snap, box, Capabilities())).kind is FrameKind.VIEW


def test_last_frames_is_bounded() -> None:
    snap = _snapshot(np.array([[1.0, 1.0]]))
    frame = generate(snap, Box((0.0, 0.0), (3.0, 3.0)), Capabilities())
    last = LastFrames(max_subscribers=10)
    for i in range(1000):
        last.filter(i, frame)
    assert len(last) == 10
    assert last.filter(999, frame).kind is FrameKind.UNCHANGED
    assert last.filter(0, frame).kind is FrameKind.VIEW  # forgotten long ago
    last.forget(0)
    assert len(last) == 9
    with pytest.raises(IntermediaryError, match="max_subscribers"):
        LastFrames(0)


def test_fifty_thousand_entities_in_one_vectorised_pass() -> None:
    rng = np.random.default_rng(4)
    positions = rng.uniform(-1000, 1000, size=(50_000, 3))
    snap = _snapshot(positions)
    region = Sphere((0.0, 0.0, 0.0), 600.0)
    original = Sphere.contains
    with mock.patch.object(Sphere, "contains", autospec=True, side_effect=original) as spy:
        frame = generate(snap, region, Capabilities(float32=True, compress=True))
    assert spy.call_count == 1
    (called_region, points), _ = spy.call_args
    assert called_region is region and np.shape(points) == (50_000, 3)
    header, ids, got = decode_frame(frame.data)
    expected = np.flatnonzero(np.einsum("ij,ij->i", positions, positions) <= 600.0**2)
    assert header.count == len(expected) and ids.shape == (len(expected),)
    assert got.shape == (len(expected), 3) and got.dtype == np.float32
    assert ids.tolist() == (expected * 3 + 5).tolist()


def test_max_entities_keeps_the_nearest_and_says_so() -> None:
    positions = np.array([[float(i), 0.0] for i in range(100)])
    snap = _snapshot(positions, ids=np.arange(100, dtype=np.int64))
    region = Box((-1.0, -1.0), (200.0, 1.0))
    frame = generate(snap, region, Capabilities(max_entities=10), own_position=(50.2, 0.0))
    header, ids, _ = decode_frame(frame.data)
    assert header.truncated and header.count == 10
    assert ids.tolist() == list(range(46, 56))
    # Without an own position: the middle of the region.
    header, ids, _ = decode_frame(generate(snap, region, Capabilities(max_entities=4)).data)
    assert ids.tolist() == [96, 97, 98, 99]  # the middle of the region is x = 99.5
    assert header.truncated and header.count == 4


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"float32": 1}, "capabilities.float32: expected true or false"),
        ({"relative": "yes"}, "capabilities.relative"),
        ({"compress": None}, "capabilities.compress"),
        ({"max_entities": 0}, "capabilities.max_entities: must be in 1.."),
        ({"max_entities": MAX_ENTITIES_CAP + 1}, "capabilities.max_entities"),
        ({"max_entities": True}, "capabilities.max_entities: expected an integer"),
        ({"max_entities": 2.5}, "capabilities.max_entities: expected an integer"),
        ({"zip": True}, "capabilities.zip: unknown"),
    ],
)
def test_bad_capabilities_are_refused_naming_the_field(spec: dict, message: str) -> None:
    with pytest.raises(IntermediaryError, match=message):
        Capabilities.parse(spec)


def test_capabilities_parse_defaults() -> None:
    assert Capabilities.parse(None) == Capabilities()
    assert Capabilities.parse({"float32": True}) == Capabilities(float32=True)
    with pytest.raises(IntermediaryError, match="capabilities: expected an object"):
        Capabilities.parse([1, 2])


def test_bad_generation_requests_are_refused() -> None:
    snap = _snapshot(np.zeros((3, 3)))
    sphere = Sphere((0.0, 0.0, 0.0), 1.0)
    with pytest.raises(IntermediaryError, match="own_position: the subscriber asked for relative"):
        generate(snap, sphere, Capabilities(relative=True))
    with pytest.raises(IntermediaryError, match="own_position: must be finite"):
        generate(snap, sphere, Capabilities(relative=True), (0.0, math.nan, 0.0))
    with pytest.raises(IntermediaryError, match="own_position: expected 3 coordinates"):
        generate(snap, sphere, Capabilities(relative=True), (0.0, 0.0))
    with pytest.raises(IntermediaryError, match="region: has 2 dimensions, the state has 3"):
        generate(snap, Sphere((0.0, 0.0), 1.0), Capabilities())
    with pytest.raises(IntermediaryError, match="region: a relative region is placed first"):
        generate(snap, Relative(sphere, 1), Capabilities())  # type: ignore[arg-type]
    with pytest.raises(IntermediaryError, match="capabilities: expected Capabilities"):
        generate(snap, sphere, {"float32": True})  # type: ignore[arg-type]


def _sample_frame(compress: bool = False, relative: bool = False) -> bytes:
    snap = _snapshot(np.random.default_rng(5).uniform(0, 10, size=(20, 3)))
    caps = Capabilities(compress=compress, relative=relative)
    own = (1.0, 2.0, 3.0) if relative else None
    return generate(snap, Box((0.0,) * 3, (10.0,) * 3), caps, own).data


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("relative", [False, True])
def test_every_truncation_is_refused(compress: bool, relative: bool) -> None:
    data = _sample_frame(compress, relative)
    decode_frame(data)
    for end in range(len(data)):
        with pytest.raises(IntermediaryError, match=r"^frame: .*(truncated|corrupt)"):
            decode_frame(data[:end])


def _with_header(data: bytes, **fields: int) -> bytes:
    values = dict(
        zip(
            ("magic", "version", "kind", "epoch", "count", "dim", "flags", "tick", "tick_time"),
            HEADER.unpack_from(data),
            strict=True,
        )
    )
    values.update(fields)
    return HEADER.pack(*values.values()) + data[HEADER.size :]


def test_garbled_frames_are_refused_naming_the_problem() -> None:
    data = _sample_frame()
    cases = [
        (b"XXXX" + data[4:], "bad magic"),
        (_with_header(data, version=9), "unsupported version 9"),
        (_with_header(data, kind=7), "unknown kind 7"),
        (_with_header(data, dim=4), "dim must be 2 or 3"),
        (_with_header(data, flags=0x80), "unknown flag bits 0x80"),
        (data + b"\0", "overlong payload"),
        (_with_header(data, count=0), "VIEW frame with 0 entities"),
        (_with_header(data, count=10**9), "truncated payload"),
        (_with_header(data, kind=2), "EMPTY frame has no entities"),
        (_with_header(data, flags=0x04), "corrupt compressed payload"),
        ("text", "expected bytes"),
    ]
    for frame, message in cases:
        with pytest.raises(IntermediaryError, match=message):
            decode_frame(frame)  # type: ignore[arg-type]


def test_non_finite_positions_and_origin_are_refused() -> None:
    header = HEADER.pack(b"TDGF", 2, 1, 0, 1, 2, 0, 0, 0.0)
    bad = header + struct.pack("<q", 1) + struct.pack("<2d", 1.0, math.inf)
    with pytest.raises(IntermediaryError, match="non-finite"):
        decode_frame(bad)
    header = HEADER.pack(b"TDGF", 2, 1, 0, 1, 2, 0x02, 0, 0.0)
    bad = header + struct.pack("<2d", math.nan, 0) + struct.pack("<q", 1) + bytes(16)
    with pytest.raises(IntermediaryError, match="origin is not finite"):
        decode_frame(bad)


def test_a_compression_bomb_is_bounded_by_the_announced_size() -> None:
    header = HEADER.pack(b"TDGF", 2, 1, 0, 1, 2, 0x04, 0, 0.0)
    bomb = header + zlib.compress(bytes(50_000_000), 9)
    with pytest.raises(IntermediaryError, match="holds more than the 24 bytes"):
        decode_frame(bomb)
    trailing = header + zlib.compress(bytes(24)) + b"junk"
    with pytest.raises(IntermediaryError, match="holds more than"):
        decode_frame(trailing)


@settings(max_examples=200, deadline=None)
@given(
    compress=st.booleans(),
    relative=st.booleans(),
    index=st.integers(min_value=0),
    value=st.integers(min_value=0, max_value=255),
)
def test_any_single_byte_change_decodes_or_is_refused(
    compress: bool, relative: bool, index: int, value: int
) -> None:
    data = bytearray(_sample_frame(compress, relative))
    data[index % len(data)] = value
    try:
        header, ids, positions = decode_frame(bytes(data))
    except IntermediaryError as exc:
        assert str(exc).startswith("frame: ")
    else:
        assert ids.shape == (header.count,) and positions.shape == (header.count, header.dim)
