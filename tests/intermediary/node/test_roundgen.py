"""A whole round generated at once (:mod:`tidings.intermediary.node.roundgen`) gives every view
byte for byte the frame :func:`~tidings.intermediary.node.generation.generate` gives it alone,
whatever the regions (boxes, spheres, sectors, huge ones, ones outside the world), the
capabilities (float32, relative, compressed, truncated) and the entities' layout."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.errors import IntermediaryError
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.generation import Capabilities, FrameKind, generate
from tidings.intermediary.node.roundgen import generate_round
from tidings.intermediary.node.snapshot import Snapshot
from tidings.intermediary.node.state import StateStore
from tidings.intermediary.regions.geometry import Box, Region, Sector, Sphere
from tidings.intermediary.regions.grid import GridIndex


def _snapshot(positions: np.ndarray) -> Snapshot:
    store = StateStore(positions.shape[1], initial_capacity=max(1, len(positions)))
    ids = np.arange(len(positions), dtype=np.int64) * 7 + 3
    store.apply(UpdateBatch(ids=ids, positions=positions, tick=4, tick_time=1.5e9))
    store.end_epoch()
    return store.snapshot()


def _region(draw: st.DrawFn, dim: int) -> Region:
    # On the grid of the clustered points too, so some lie exactly on a boundary.
    coordinate = st.one_of(st.floats(-20, 120), st.integers(0, 10).map(lambda i: i * 10.0))
    centre = tuple(draw(coordinate) for _ in range(dim))
    size = draw(st.sampled_from([0.5, 3.0, 10.0, 20.0, 40.0, 500.0]))
    kind = draw(st.sampled_from(["sphere", "sphere", "box", "sector"]))
    if kind == "sphere":
        return Sphere(centre, size)
    if kind == "box":
        return Box(tuple(c - size for c in centre), tuple(c + size * 0.7 for c in centre))
    return Sector(centre, size, (1.0,) + (0.0,) * (dim - 1), math.pi / 4)


@st.composite
def rounds(draw: st.DrawFn) -> tuple[np.ndarray, list]:
    dim = draw(st.sampled_from([2, 3]))
    n = draw(st.integers(0, 400))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    positions = rng.uniform(0, 100, size=(n, dim))
    if n and draw(st.booleans()):  # clustered, with points on cell and region edges
        positions[: n // 2] = np.round(positions[: n // 2] / 10) * 10
    views = []
    for _ in range(draw(st.integers(1, 12))):
        caps = Capabilities(
            float32=draw(st.booleans()),
            relative=draw(st.booleans()),
            compress=draw(st.booleans()),
            max_entities=draw(st.sampled_from([3, 100_000])),
        )
        own = tuple(draw(st.floats(0, 100)) for _ in range(dim)) if draw(st.booleans()) else None
        if caps.relative and own is None:
            own = (50.0,) * dim
        views.append((_region(draw, dim), caps, own))
    return positions, views


@settings(max_examples=150, deadline=None)
@given(rounds())
def test_a_round_at_once_gives_each_view_the_frame_generate_gives(case) -> None:
    positions, views = case
    snapshot = _snapshot(positions)
    frames = generate_round(snapshot, GridIndex(snapshot.positions), views)
    for frame, (region, caps, own) in zip(frames, views, strict=True):
        alone = generate(snapshot, region, caps, own)
        assert (frame.data, frame.digest, frame.kind) == (alone.data, alone.digest, alone.kind)


def test_views_of_a_crowded_world_match_and_are_not_all_empty() -> None:
    rng = np.random.default_rng(5)
    snapshot = _snapshot(rng.uniform(0, 1000, size=(20_000, 2)))
    views = [
        (Sphere(tuple(rng.uniform(0, 1000, 2)), 20.0), Capabilities(float32=True), None)
        for _ in range(200)
    ]
    frames = generate_round(snapshot, GridIndex(snapshot.positions), views)
    assert all(f.kind is FrameKind.VIEW for f in frames)
    for frame, (region, caps, own) in zip(frames, views, strict=True):
        assert frame.data == generate(snapshot, region, caps, own).data


def test_a_refusal_is_the_one_generate_gives() -> None:
    snapshot = _snapshot(np.random.default_rng(1).uniform(0, 100, size=(50, 2)))
    index = GridIndex(snapshot.positions)
    relative = Capabilities(relative=True)
    with pytest.raises(IntermediaryError, match="own_position"):
        generate_round(snapshot, index, [(Sphere((5.0, 5.0), 3.0), relative, None)])
    with pytest.raises(IntermediaryError, match="own_position: must be finite"):
        generate_round(snapshot, index, [(Sphere((5.0, 5.0), 3.0), relative, (math.nan, 1.0))])
    with pytest.raises(IntermediaryError, match="region: has 3 dimensions"):
        generate_round(snapshot, index, [(Sphere((5.0, 5.0, 5.0), 3.0), Capabilities(), None)])
