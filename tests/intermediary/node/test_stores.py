"""The publisher and subscriber stores, and claim 1 wired through both."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.errors import IntermediaryError
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.generation import Capabilities, decode_frame, generate
from tidings.intermediary.node.placements import place
from tidings.intermediary.node.publisher_store import PublisherStore
from tidings.intermediary.node.snapshot import Snapshot
from tidings.intermediary.node.state import StateStore
from tidings.intermediary.node.subscribe import replan, subscribe_request, unsubscribe_request
from tidings.intermediary.node.subscriber_store import SubscriberStore
from tidings.intermediary.regions import coverage
from tidings.intermediary.regions.coverage import UpstreamPolicy
from tidings.intermediary.regions.geometry import Box, Relative, Sphere


def _box(lo: float, hi: float, dim: int = 2) -> Box:
    return Box((lo,) * dim, (hi,) * dim)


def _volume(boxes: tuple[Box, ...]) -> float:
    return sum(box.volume() for box in boxes)


def _state(positions: dict[int, tuple[float, ...]], dim: int = 2) -> StateStore:
    store = StateStore(dim)
    if positions:
        store.apply(UpdateBatch(ids=list(positions), positions=np.array(list(positions.values()))))
    store.end_epoch()
    return store


def test_claim_1_second_subscriber_inside_the_first_costs_nothing_upstream() -> None:
    publishers, upstream = PublisherStore(2), SubscriberStore(2)
    first = subscribe_request(publishers, upstream, None, "alice", "view", _box(0, 10))
    # Step 2: recorded; steps 4-5: not covered, so the whole region is requested upstream.
    assert publishers.subscriptions("alice")["view"].subscription == _box(0, 10)
    assert not first.covered
    assert first.upstream.added == [_box(0, 10)] and first.upstream.removed == []
    assert upstream.boxes == (_box(0, 10),)
    # A second subscriber wholly inside: recorded, covered, no upstream request.
    second = subscribe_request(
        publishers, upstream, None, "bob", "view", Sphere((5.0, 5.0), 2.0), priority=3
    )
    assert second.covered and not second.upstream
    assert publishers.subscriptions("bob")["view"].priority == 3.0
    assert upstream.boxes == (_box(0, 10),)
    # A third overlapping the first: only the uncovered part goes upstream.
    third = subscribe_request(publishers, upstream, None, "carol", "view", Box((5, 5), (15, 15)))
    assert not third.covered and third.upstream.added
    added = third.upstream.added
    # [5, 15]^2 less [0, 10]^2: 100 - 25, in disjoint pieces.
    assert math.isclose(_volume(tuple(added)), 75.0, rel_tol=1e-12)
    for box in added:  # nothing already held is asked for again
        assert not coverage.covers([_box(0, 10)], box)
    assert upstream.covers(Box((5, 5), (15, 15))) and upstream.covers(_box(0, 10))
    assert len(publishers) == 3


def test_unsubscribe_is_debounced_and_replan_shrinks_upstream() -> None:
    publishers, upstream = PublisherStore(3), SubscriberStore(3)
    subscribe_request(publishers, upstream, None, "a", "v", _box(0, 10, 3))
    subscribe_request(publishers, upstream, None, "b", "v", _box(100, 110, 3))
    assert len(upstream.boxes) == 2
    assert unsubscribe_request(publishers, upstream, "b")
    # Nothing is re-planned until asked.
    assert upstream.stale and len(upstream.boxes) == 2
    diff = replan(publishers, upstream, None)
    assert diff.added == [] and diff.removed == [_box(100, 110, 3)]
    assert upstream.boxes == (_box(0, 10, 3),) and not upstream.stale
    assert not upstream.covers(_box(100, 110, 3))
    # Up to date: a second replan changes nothing; unsubscribing twice is harmless.
    assert not replan(publishers, upstream, None)
    assert unsubscribe_request(publishers, upstream, "b") == []
    assert not upstream.stale
    unsubscribe_request(publishers, upstream, "a", "v")
    assert replan(publishers, upstream, None).removed == [_box(0, 10, 3)]
    assert upstream.boxes == () and len(publishers) == 0 and publishers.subscribers() == []


def test_replacing_a_subscription_marks_upstream_for_shrinking() -> None:
    publishers, upstream = PublisherStore(2), SubscriberStore(2)
    subscribe_request(publishers, upstream, None, "a", "v", _box(0, 10))
    outcome = subscribe_request(publishers, upstream, None, "a", "v", _box(50, 60))
    assert outcome.replaced is not None and outcome.replaced.subscription == _box(0, 10)
    assert len(publishers) == 1 and upstream.stale
    assert upstream.covers(_box(50, 60))
    replan(publishers, upstream, None)
    assert upstream.boxes == (_box(50, 60),)


def test_relative_subscriptions_are_placed_from_the_snapshot() -> None:
    state = _state({7: (10.0, 20.0), 8: (-5.0, -5.0)})
    snap = state.snapshot()
    publishers, upstream = PublisherStore(2), SubscriberStore(2)
    relative = Relative(Sphere((0.0, 0.0), 2.0), 7)
    outcome = subscribe_request(publishers, upstream, snap, "p7", "near", relative)
    assert outcome.region == Sphere((10.0, 20.0), 2.0) and outcome.unplaced is None
    assert upstream.covers(Sphere((10.0, 20.0), 2.0))
    assert publishers.subscriptions("p7")["near"].subscription is relative  # kept relative
    # The entity moves: the live region follows, and track re-covers it.
    state.apply(UpdateBatch(ids=[7], positions=[[40.0, 40.0]]))
    state.end_epoch()
    placed = publishers.live_regions(state.snapshot())
    assert placed.only_regions() == [Sphere((40.0, 40.0), 2.0)] and placed.unplaced == []
    assert not upstream.covers(Sphere((40.0, 40.0), 2.0))
    diff = upstream.track(placed.only_regions())
    assert diff.added and upstream.covers(Sphere((40.0, 40.0), 2.0))
    upstream.unsubscribe()
    replan(publishers, upstream, state.snapshot())
    assert not upstream.covers(Sphere((10.0, 20.0), 2.0))


@settings(max_examples=150, deadline=None)
@given(
    start=st.lists(st.tuples(st.floats(0, 90), st.floats(0, 90)), min_size=1, max_size=30),
    moves=st.lists(st.tuples(st.floats(-15, 15), st.floats(-15, 15)), min_size=1, max_size=30),
    margin=st.sampled_from([0.0, 2.0, 10.0]),
)
def test_track_keeps_every_moving_region_covered(
    start: list[tuple[float, float]], moves: list[tuple[float, float]], margin: float
) -> None:
    """Each epoch the moving regions are checked at once (bounding boxes) and one by one only
    where that does not settle it; after track, every one is covered (the exact test). Told
    how far each may move before the next epoch (``ahead``), a region that moved no farther
    was covered already before the next track: it had been re-covered ahead of time, so
    upstream was sending it."""
    upstream = SubscriberStore(2, UpstreamPolicy.margin(margin) if margin else None)
    centres = np.array(start)
    factor = np.arange(len(centres))[:, None] % 3 - 1  # some still, some each way
    for step, move in enumerate(moves):
        centres = centres + np.array(move) * factor
        regions = [
            Sphere(tuple(c.tolist()), 3.0)
            if i % 2
            else Box(tuple((c - 2.0).tolist()), tuple((c + 2.0).tolist()))
            for i, c in enumerate(centres)
        ]
        before = list(upstream.boxes)
        if step:  # each moved at most as far as it was told at the previous step
            for region in regions:
                assert coverage.covers(before, region), (step, region)
        following = moves[step + 1] if step + 1 < len(moves) else (0.0, 0.0)
        # A bound on the next move, as the intermediary gives one (twice the last step):
        # on the nose, two roundings of the same edge could differ in the last bit.
        ahead = 1.01 * np.abs(np.array(following) * factor).max(axis=1)
        upstream.track(regions, ahead)
        for region in regions:
            assert coverage.covers(list(upstream.boxes), region), (step, region)


def test_a_relative_subscription_to_an_absent_entity_waits_for_it() -> None:
    state = _state({1: (0.0, 0.0)})
    publishers, upstream = PublisherStore(2), SubscriberStore(2)
    relative = Relative(_box(-1, 1), 99)
    outcome = subscribe_request(publishers, upstream, state.snapshot(), "x", "v", relative)
    assert outcome.region is None and "entity 99 is not in the state" in (outcome.unplaced or "")
    assert not outcome.upstream and upstream.boxes == ()
    assert len(publishers) == 1  # recorded all the same
    state.apply(UpdateBatch(ids=[99], positions=[[5.0, 5.0]]))
    state.end_epoch()
    placed = publishers.live_regions(state.snapshot())
    assert upstream.track(placed.only_regions()).added == [Box((4.0, 4.0), (6.0, 6.0))]


def test_place_reports_why_a_relative_region_cannot_be_placed() -> None:
    snap: Snapshot = _state({1: (0.0, 0.0)}).snapshot()
    assert place(_box(0, 1), None) == _box(0, 1)
    assert "no state yet" in str(place(Relative(_box(0, 1), 1), None))
    assert "is not an integer" in str(place(Relative(_box(0, 1), "one"), snap))
    assert "does not fit in int64" in str(place(Relative(_box(0, 1), 2**70), snap))
    far = _state({1: (9.9e8, 0.0)}).snapshot()
    assert "beyond the largest allowed extent" in str(place(Relative(_box(0, 2e7), 1), far))


def test_publisher_store_bounds_hold_under_a_flood() -> None:
    publishers = PublisherStore(2, max_subscribers=50, max_per_subscriber=3)
    upstream = SubscriberStore(2, UpstreamPolicy.exact(max_boxes=8))
    rng = np.random.default_rng(7)
    for i in range(50):
        publishers.put(i, "a", _box(0, 1))
    with pytest.raises(IntermediaryError, match="at most 50 subscribers and is full"):
        publishers.put("late", "a", _box(0, 1))
    for key in ("b", "c"):
        publishers.put(0, key, _box(0, 1))
    with pytest.raises(IntermediaryError, match="already has the most subscriptions allowed"):
        publishers.put(0, "d", _box(0, 1))
    publishers.put(0, "c", _box(2, 3))  # replacing is not adding
    assert len(publishers) == 52
    for i in range(50):
        publishers.remove(i)
    assert len(publishers) == 0 and publishers.subscribers() == []
    # A flood of subscribe/unsubscribe: memory stays bounded, upstream stays bounded.
    for step in range(400):
        sid = int(rng.integers(0, 200))
        if rng.random() < 0.5 and sid in publishers:
            unsubscribe_request(publishers, upstream, sid)
            continue
        lo = rng.uniform(-1000, 1000, size=2)
        region = Box(tuple(lo), tuple(lo + rng.uniform(1, 50, size=2)))
        try:
            subscribe_request(publishers, upstream, None, sid, f"k{step % 5}", region)
        except IntermediaryError as exc:
            assert "full" in str(exc) or "most subscriptions" in str(exc)
        assert len(publishers.subscribers()) <= 50 and len(publishers) <= 150
        assert len(upstream.boxes) <= 8
    replan(publishers, upstream, None)
    live = publishers.live_regions(None).only_regions()
    assert all(upstream.covers(region) for region in live)
    for sid in publishers.subscribers():
        unsubscribe_request(publishers, upstream, sid)
    replan(publishers, upstream, None)
    assert upstream.boxes == () and len(publishers) == 0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: p.put("a", "v", _box(0, 1, 3)), "has 3 dimensions, the state has 2"),
        (lambda p: p.put("a", "v", _box(0, 1), priority=math.nan), "priority: expected"),
        (lambda p: p.put("a", "v", _box(0, 1), priority=-1), "priority: expected"),
        (lambda p: p.put("a", "v", _box(0, 1), priority=True), "priority: expected"),
        (lambda p: p.put("a", "", _box(0, 1)), "key: expected a name"),
        (lambda p: p.put("a", "k" * 500, _box(0, 1)), "key: expected a name"),
        (lambda p: p.put(["a"], "v", _box(0, 1)), "subscriber: expected a hashable id"),
        (lambda p: p.put("a", "v", {"box": 1}), "subscription: expected a region"),
        (lambda p: p.put("a", "v", _box(0, 1), 0, {"float32": 1}), "capabilities: expected"),
    ],
)
def test_bad_subscriptions_are_refused_and_change_nothing(call, message: str) -> None:  # type: ignore[no-untyped-def]
    publishers = PublisherStore(2)
    with pytest.raises(IntermediaryError, match=message):
        call(publishers)
    assert len(publishers) == 0 and publishers.subscribers() == []


def test_capabilities_and_priority_are_kept_with_the_record() -> None:
    publishers = PublisherStore(2)
    caps = Capabilities(float32=True, relative=True)
    record, old = publishers.put("a", "v", _box(0, 1), priority=7.5, capabilities=caps)
    assert old is None and record.capabilities == caps and record.priority == 7.5
    assert publishers.subscriptions("a")["v"] == record


def test_subscriber_store_refuses_what_it_cannot_cover() -> None:
    upstream = SubscriberStore(2)
    with pytest.raises(IntermediaryError, match="relative region is placed first"):
        upstream.subscribe(Relative(_box(0, 1), 1))  # type: ignore[arg-type]
    with pytest.raises(IntermediaryError, match="has 3 dimensions, the upstream set has 2"):
        upstream.covers(_box(0, 1, 3))
    with pytest.raises(IntermediaryError, match="dim: expected 2 or 3"):
        SubscriberStore(4)
    with pytest.raises(IntermediaryError, match="world: expected a 2D Box"):
        SubscriberStore(2, world=_box(0, 1, 3))
    with pytest.raises(IntermediaryError, match="publisher store is 3D"):
        subscribe_request(PublisherStore(3), upstream, None, "a", "v", _box(0, 1, 3))


def test_bounding_policy_keeps_one_upstream_box() -> None:
    publishers = PublisherStore(2)
    upstream = SubscriberStore(2, UpstreamPolicy.bounding())
    subscribe_request(publishers, upstream, None, "a", "v", _box(0, 1))
    outcome = subscribe_request(publishers, upstream, None, "b", "v", _box(10, 11))
    assert upstream.boxes == (_box(0, 11),)
    assert outcome.upstream.added == [_box(0, 11)] and outcome.upstream.removed == [_box(0, 1)]


def test_a_request_refused_by_coverage_leaves_both_stores_as_they_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    publishers, upstream = PublisherStore(2), SubscriberStore(2)
    subscribe_request(publishers, upstream, None, "a", "v", _box(0, 1), priority=2)

    def refuse(*args: object, **kwargs: object) -> bool:
        raise IntermediaryError("upstream: too finely cut")

    monkeypatch.setattr(coverage, "covers", refuse)
    with pytest.raises(IntermediaryError, match="too finely cut"):
        subscribe_request(publishers, upstream, None, "a", "v", _box(5, 6))
    with pytest.raises(IntermediaryError, match="too finely cut"):
        subscribe_request(publishers, upstream, None, "b", "v", _box(5, 6))
    assert publishers.subscribers() == ["a"] and len(publishers) == 1
    assert publishers.subscriptions("a")["v"].subscription == _box(0, 1)
    assert publishers.subscriptions("a")["v"].priority == 2.0
    assert upstream.boxes == (_box(0, 1),) and not upstream.stale


def test_a_relative_record_generates_its_view_around_its_entity() -> None:
    state = _state({1: (10.0, 10.0), 2: (11.0, 10.5), 3: (50.0, 50.0)})
    snap = state.snapshot()
    publishers = PublisherStore(2)
    caps = Capabilities(relative=True, float32=True)
    record, _ = publishers.put("p1", "near", Relative(Sphere((0.0, 0.0), 3.0), 1), 1, caps)
    ((placed_record, region),) = publishers.live_regions(snap).regions
    assert placed_record is record
    own = snap.position_of(1)
    header, ids, positions = decode_frame(generate(snap, region, record.capabilities, own).data)
    assert ids.tolist() == [1, 2] and header.origin == (10.0, 10.0)
    assert positions.tolist() == [[0.0, 0.0], [1.0, 0.5]]
