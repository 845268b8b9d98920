"""The spatial feed's batch codec (:mod:`tidings.intermediary.feed.wire`): a batch survives
encoding and decoding, the bytes are the documented layout, and a malformed batch is refused
naming the problem."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.errors import IntermediaryError
from tidings.intermediary.feed.wire import (
    HEADER,
    MAGIC,
    VERSION,
    decode_batch,
    encode_batch,
)
from tidings.intermediary.node.batches import UpdateBatch

# -- the batch codec -----------------------------------------------------------------------


def batch_of(dim: int, ids: Sequence[int], deleted: Sequence[int], seed: int = 0) -> UpdateBatch:
    rng = np.random.default_rng(seed)
    return UpdateBatch(
        ids=np.array(ids, dtype=np.int64),
        positions=rng.uniform(-1e6, 1e6, size=(len(ids), dim)),
        delete=np.array(deleted, dtype=np.int64),
        tick=41,
        tick_time=1_700_000_000.25,
    )


def assert_same_batch(got: UpdateBatch, sent: UpdateBatch, dim: int) -> None:
    ids = np.asarray(sent.ids, dtype=np.int64)
    assert got.ids.dtype == np.int64 and got.delete.dtype == np.int64
    assert got.positions is not None and got.positions.dtype == np.float64
    assert got.positions.shape == (len(ids), dim)
    np.testing.assert_array_equal(got.ids, ids)
    if sent.positions is not None:
        np.testing.assert_array_equal(got.positions, np.asarray(sent.positions))
    np.testing.assert_array_equal(got.delete, np.asarray(sent.delete, dtype=np.int64))
    assert got.tick == (0 if sent.tick is None else sent.tick)
    assert got.tick_time == sent.tick_time


int64s = st.integers(-(2**63), 2**63 - 1)
coordinates = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    dim=st.sampled_from([2, 3]),
    ids=st.lists(int64s, max_size=40, unique=True),
    deleted=st.lists(int64s, max_size=20, unique=True),
    tick=st.integers(0, 2**64 - 1),
    tick_time=st.floats(allow_nan=False, allow_infinity=False),
)
def test_a_batch_survives_encoding_and_decoding(
    data: st.DataObject,
    dim: int,
    ids: list[int],
    deleted: list[int],
    tick: int,
    tick_time: float,
) -> None:
    positions = data.draw(
        st.lists(
            st.lists(coordinates, min_size=dim, max_size=dim),
            min_size=len(ids),
            max_size=len(ids),
        )
    )
    sent = UpdateBatch(
        ids=np.array(ids, dtype=np.int64),
        positions=np.array(positions, dtype=np.float64).reshape(len(ids), dim),
        delete=np.array(deleted, dtype=np.int64),
        tick=tick,
        tick_time=tick_time,
    )
    message = encode_batch(sent, dim, applied=tick // 2)
    assert len(message) == HEADER.size + 8 * (len(ids) * (1 + dim) + len(deleted))
    got, applied = decode_batch(message, dim)
    assert_same_batch(got, sent, dim)
    assert applied == tick // 2


def test_the_wire_layout_is_the_documented_header_then_ids_positions_and_deletions() -> None:
    sent = batch_of(3, [7, -2, 2**62], [5, 9], seed=1)
    message = encode_batch(sent, 3, applied=6)
    # The documented format: 4 + 1 + 1 + 2 + 8 + 8 + 8 + 4 + 4 bytes.
    assert HEADER.size == struct.calcsize("<4sBBHQQdII") == 40
    fields = struct.unpack_from("<4sBBHQQdII", message)
    assert (MAGIC, VERSION) == (b"TSFB", 1)
    assert fields == (b"TSFB", 1, 3, 0, 41, 6, 1_700_000_000.25, 3, 2)
    body = message[40:]
    assert struct.unpack_from("<3q", body) == (7, -2, 2**62)
    positions = struct.unpack_from("<9d", body, 24)
    assert positions == tuple(np.asarray(sent.positions).ravel().tolist())
    assert struct.unpack_from("<2q", body, 24 + 72) == (5, 9)
    assert len(body) == 24 + 72 + 16


@pytest.mark.parametrize("dim", [2, 3])
def test_an_empty_batch_and_a_deletions_only_batch_round_trip(dim: int) -> None:
    empty = UpdateBatch(tick=None, tick_time=0.0)
    message = encode_batch(empty, dim)
    assert len(message) == HEADER.size
    got, applied = decode_batch(message, dim)
    assert_same_batch(got, empty, dim)
    assert got.tick == 0 and len(got.ids) == 0 and len(got.delete) == 0 and applied == 0

    deletions = UpdateBatch(delete=np.array([3, 1, 2]), tick=9, tick_time=12.5)
    got, _ = decode_batch(encode_batch(deletions, dim), dim)
    assert_same_batch(got, deletions, dim)


def test_a_batch_whose_positions_do_not_match_its_ids_is_not_encoded() -> None:
    bad = UpdateBatch(ids=np.array([1, 2]), positions=np.zeros((2, 3)), tick=1)
    with pytest.raises(IntermediaryError, match=r"2 ids need positions of shape \(2, 2\)"):
        encode_batch(bad, 2)
    with pytest.raises(IntermediaryError, match=r"tick time must be finite"):
        encode_batch(UpdateBatch(tick=1, tick_time=math.inf), 2)
    with pytest.raises(IntermediaryError, match=r"tick must be in \[0, 2\*\*64\), not -1"):
        encode_batch(UpdateBatch(tick=-1), 2)
    with pytest.raises(IntermediaryError, match=r"applied must be in"):
        encode_batch(UpdateBatch(tick=1), 2, applied=2**64)


def good_message(dim: int = 2) -> bytes:
    return encode_batch(batch_of(dim, [1, 2, 3], [4]), dim)


def with_header(message: bytes, **fields: Any) -> bytes:
    names = ("magic", "version", "dim", "reserved", "tick", "applied", "tick_time", "n", "m")
    values = dict(zip(names, HEADER.unpack_from(message), strict=True))
    values.update(fields)
    return HEADER.pack(*(values[name] for name in names)) + message[HEADER.size :]


@pytest.mark.parametrize(
    ("message", "dim", "problem"),
    [
        (b"", 2, r"a batch of 0 bytes is shorter than its header"),
        (good_message()[: HEADER.size - 1], 2, r"39 bytes is shorter than its header"),
        (with_header(good_message(), magic=b"XSFB"), 2, r"not a version 1 batch \(b'XSFB' v1\)"),
        (with_header(good_message(), version=2), 2, r"not a version 1 batch \(b'TSFB' v2\)"),
        (good_message(2), 3, r"a 2D batch for a 3D intermediary"),
        (good_message(3), 2, r"a 3D batch for a 2D intermediary"),
        (good_message() + b"\0" * 8, 2, r"3 upserts and 1 deletions cannot be 128 bytes"),
        (good_message()[:-8], 2, r"3 upserts and 1 deletions cannot be 112 bytes"),
        (with_header(good_message(), n=4), 2, r"4 upserts and 1 deletions cannot be 120 bytes"),
        (with_header(good_message(), tick_time=math.nan), 2, r"tick time must be finite"),
        (with_header(good_message(), tick_time=-math.inf), 2, r"tick time must be finite"),
    ],
    ids=[
        "empty",
        "short",
        "magic",
        "version",
        "2D-for-3D",
        "3D-for-2D",
        "long",
        "truncated",
        "counts",
        "nan-time",
        "inf-time",
    ],
)
def test_a_malformed_batch_is_refused_naming_the_problem(
    message: bytes, dim: int, problem: str
) -> None:
    assert len(good_message()) == 120  # 40 + 8 * (3 + 3 * 2 + 1)
    with pytest.raises(IntermediaryError, match=problem):
        decode_batch(message, dim)
