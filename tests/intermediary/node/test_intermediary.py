"""The intermediary process (issue 12 item 4) against the spatial simulation publisher,
driven tick by tick: views equal a brute-force selection from the publisher's positions,
upstream subscriptions follow claim 1, bad requests are refused with the stores unchanged."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.intermediary_helpers import SMALL, WHOLE, WORLD, inside
from tidings.errors import IntermediaryError
from tidings.intermediary.node.generation import FrameHeader, FrameKind, decode_frame
from tidings.intermediary.node.intermediary import Intermediary, Served
from tidings.intermediary.node.scheduling import Scheduler
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.regions.coverage import covers
from tidings.intermediary.regions.geometry import Box, Sphere

NEAR_7 = {"sphere": {"center": [0, 0], "radius": 20}, "relative_to": 7}

#: A frame served in :func:`rounds`: the epoch, the frame served, its header, ids and positions.
Round = tuple[int, Served, FrameHeader, np.ndarray, np.ndarray]


def setup(n: int = 300) -> tuple[Simulation, Intermediary]:
    sim = Simulation(n, WORLD, max_speed=5.0, seed=1)
    feed = sim.feed()
    return sim, Intermediary(2, feed, world=WORLD, scheduler=Scheduler())


def tick(sim: Simulation, node: Intermediary) -> int:
    sim.step(0.1)
    node.apply(sim.feeds[0].batch())
    return node.end_epoch()


def rounds(sim: Simulation, node: Intermediary, ticks: int) -> Iterator[Round]:
    """Each frame served in ``ticks`` ticks 0.1 s apart, one round after each tick: the tick's
    epoch, the frame served, and the frame decoded (its epoch checked to be the tick's)."""
    now = 0.0
    for _ in range(ticks):
        epoch = tick(sim, node)
        now += 0.1
        for served in node.round(now, budget=10):
            header, ids, positions = decode_frame(served.frame.data)
            assert header.epoch == epoch
            yield epoch, served, header, ids, positions


def test_views_equal_a_brute_force_selection_from_the_publishers_positions() -> None:
    sim, node = setup()
    specs = {"a": WHOLE, "b": SMALL, "c": NEAR_7}
    node.subscribe("a", "k", WHOLE, rate_hz=1000)
    node.subscribe("b", "k", SMALL, rate_hz=1000, capabilities={"compress": True})
    node.subscribe("c", "k", NEAR_7, rate_hz=1000, capabilities={"relative": True, "float32": True})
    seen: dict[str, int] = {"a": 0, "b": 0, "c": 0}
    for _, served, header, ids, positions in rounds(sim, node, 20):
        expected = sim.ids[inside(sim.positions, specs[served.subscriber])]
        if served.frame.kind is FrameKind.EMPTY:
            assert expected.size == 0
            continue
        if served.frame.kind is FrameKind.UNCHANGED:
            continue
        np.testing.assert_array_equal(ids, expected)
        world = positions.astype(float) + (np.asarray(header.origin) if header.relative else 0)
        np.testing.assert_allclose(world, sim.positions[ids], atol=1e-4)
        seen[served.subscriber] += 1
    assert all(count >= 10 for count in seen.values()), seen


def test_a_covered_subscription_subscribes_nothing_upstream_and_unsubscribing_shrinks_it() -> None:
    sim, node = setup()
    feed = sim.feeds[0]
    first = node.subscribe("a", "k", {"box": {"lo": [10, 10], "hi": [60, 60]}})
    assert not first.covered and feed.boxes
    before = feed.boxes
    second = node.subscribe("b", "k", SMALL)
    assert second.covered
    assert feed.boxes == before
    tick(sim, node)
    assert node.unsubscribe("a") == 1
    assert feed.boxes == before  # shrinks once per epoch, not per request
    tick(sim, node)
    assert feed.boxes != before
    assert sum(b.volume() for b in feed.boxes) < sum(b.volume() for b in before)
    assert covers(list(feed.boxes), Sphere((30.0, 40.0), 15.0))


def test_a_relative_subscription_is_followed_upstream_as_its_entity_moves() -> None:
    sim, node = setup()
    feed = sim.feeds[0]
    node.subscribe("a", "k", WHOLE)
    tick(sim, node)
    node.subscribe("c", "k", NEAR_7, rate_hz=1000)
    node.unsubscribe("a")
    now = 0.0
    for _ in range(30):
        tick(sim, node)
        now += 0.1
        where = sim.positions[7]
        assert covers(list(feed.boxes), Sphere(tuple(where), 20.0))
        assert any(np.all(b.contains(where[None, :])) for b in feed.boxes)
        node.round(now, budget=10)


def test_a_relative_subscription_on_an_idle_intermediary_fetches_its_entity() -> None:
    """Nothing else is subscribed, so only following entity 7 upstream brings it into the
    state; the view is then the brute-force selection around it (it stayed EMPTY before)."""
    sim, node = setup()
    feed = sim.feeds[0]
    node.subscribe("c", "k", NEAR_7, rate_hz=1000)
    assert feed.followed == frozenset({7})
    full = 0
    for epoch, served, _, ids, _ in rounds(sim, node, 10):
        if served.frame.kind is FrameKind.UNCHANGED:
            continue
        expected = sim.ids[inside(sim.positions, NEAR_7)]
        assert served.frame.kind is not FrameKind.EMPTY or epoch == 1  # 7 arrives first
        if epoch > 1:
            np.testing.assert_array_equal(ids, expected)
            full += 1
    assert full >= 5
    node.unsubscribe("c")
    tick(sim, node)
    assert feed.followed == frozenset() and feed.boxes == ()


@pytest.mark.parametrize(
    ("spec", "caps", "message"),
    [
        ({"sphere": {"center": [math.nan, 0], "radius": 1}}, None, "center"),
        ({"cube": {"lo": [0, 0], "hi": [1, 1]}}, None, "cube"),
        ({"sphere": {"center": [0, 0], "radius": 1e300}}, None, "extent"),
        ({"sphere": {"center": [0, 0, 0], "radius": 1}}, None, "dim"),
        (SMALL, {"relative": True}, "relative"),
        (SMALL, {"teleport": True}, "teleport"),
    ],
)
def test_a_bad_subscribe_is_refused_and_changes_nothing(
    spec: dict, caps: object, message: str
) -> None:
    sim, node = setup()
    node.subscribe("a", "k", SMALL)
    boxes = sim.feeds[0].boxes
    with pytest.raises(IntermediaryError) as caught:
        node.subscribe("b", "k", spec, capabilities=caps)
    assert message in str(caught.value).lower()
    assert node.publishers.subscribers() == ["a"]
    assert sim.feeds[0].boxes == boxes


@pytest.mark.parametrize("rate", [0, -1, math.nan, math.inf, True])
def test_a_bad_rate_is_refused(rate: float) -> None:
    _, node = setup()
    with pytest.raises(IntermediaryError, match="rate_hz"):
        node.subscribe("a", "k", SMALL, rate_hz=rate)
    assert node.publishers.subscribers() == []


def test_the_feed_deletes_agents_that_left_its_boxes_and_counts_bytes() -> None:
    sim, node = setup()
    node.subscribe("a", "k", {"box": {"lo": [0, 0], "hi": [50, 100]}})
    for _ in range(30):
        tick(sim, node)
        snapshot = node.state.snapshot()
        expected = sim.ids[sim.positions[:, 0] <= 50]
        np.testing.assert_array_equal(snapshot.ids, expected)
    assert sim.feeds[0].bytes_sent > 0 and sim.feeds[0].batches == 30


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    dt=st.floats(0, 1000, allow_nan=False),
    dim=st.sampled_from([2, 3]),
)
def test_agents_stay_inside_the_world(seed: int, dt: float, dim: int) -> None:
    world = Box((0.0,) * dim, (10.0,) * dim)
    sim = Simulation(50, world, max_speed=3.0, seed=seed)
    speeds = np.linalg.norm(sim.velocities, axis=1)
    for _ in range(3):
        sim.step(dt)
        assert np.all(world.contains(sim.positions))
    np.testing.assert_allclose(np.linalg.norm(sim.velocities, axis=1), speeds)


def test_simulation_refuses_bad_input() -> None:
    with pytest.raises(IntermediaryError, match="n must"):
        Simulation(-1, WORLD)
    with pytest.raises(IntermediaryError, match="dt"):
        Simulation(1, WORLD).step(math.nan)
    with pytest.raises(IntermediaryError, match="not subscribed"):
        Simulation(1, WORLD).feed().unsubscribe([Box((0.0, 0.0), (1.0, 1.0))])


class RefusingOnce:
    """Fault injection: an upstream whose next subscribe fails (a publisher that is down or
    refuses cannot be made to fail on cue); otherwise it forwards to the simulation feed."""

    def __init__(self, inner: object) -> None:
        self.inner, self.fail = inner, True

    def subscribe(self, boxes: list[Box]) -> None:
        if self.fail:
            self.fail = False
            raise ConnectionError("publisher unreachable")
        self.inner.subscribe(boxes)

    def unsubscribe(self, boxes: list[Box]) -> None:
        self.inner.unsubscribe(boxes)


def test_a_subscription_upstream_did_not_take_is_undone() -> None:
    sim = Simulation(50, WORLD, seed=2)
    feed = sim.feed()
    node = Intermediary(2, RefusingOnce(feed), world=WORLD, scheduler=Scheduler())
    with pytest.raises(IntermediaryError, match="publisher unreachable"):
        node.subscribe("a", "k", SMALL)
    assert node.subscriptions.boxes == () and not node.publishers.subscriptions("a")
    assert feed.boxes == ()
    again = node.subscribe("a", "k", SMALL)  # the stores say what upstream holds: retried
    assert not again.covered and feed.boxes == node.subscriptions.boxes
    assert covers(list(feed.boxes), Sphere((30.0, 40.0), 15.0))


def test_every_frame_carries_the_publishers_tick_and_its_wall_clock_time() -> None:
    """Staleness needs the tick's time at the subscriber: VIEW, UNCHANGED and EMPTY frames
    all carry the newest tick their epoch holds, and the time the publisher stamped it."""
    times = iter(1000.0 + 0.1 * i for i in range(100))
    sim = Simulation(300, WORLD, max_speed=0.0, seed=1, clock=lambda: next(times))
    node = Intermediary(2, sim.feed(), world=WORLD, scheduler=Scheduler())
    node.subscribe("a", "k", SMALL, rate_hz=1000)
    node.subscribe("e", "k", {"box": {"lo": [0, 0], "hi": [1e-9, 1e-9]}}, rate_hz=1000)
    kinds: set[FrameKind] = set()
    for step in range(1, 4):
        tick(sim, node)
        for served in node.round(float(step), budget=10):
            header, _, _ = decode_frame(served.frame.data)
            kinds.add(header.kind)
            assert (header.tick, header.tick_time) == (step, 1000.0 + 0.1 * (step - 1))
    assert kinds == {FrameKind.VIEW, FrameKind.UNCHANGED, FrameKind.EMPTY}


def test_readiness_of_a_subscriber_not_scheduled_is_ignored_and_a_scheduled_one_is_held() -> None:
    sim, node = setup()
    tick(sim, node)
    node.subscribe("a", "k", SMALL, rate_hz=10)
    node.set_ready("nobody", False)  # not scheduled: ignored
    node.set_ready(["unhashable"], True)  # type: ignore[arg-type]  # never scheduled either
    node.set_ready("a", False)
    assert node.status("a").ready is False
    node.set_ready("a", True)
    assert node.status("a").ready is True


def test_a_round_planned_then_finished_serves_only_what_is_still_subscribed() -> None:
    """The round's parts as the server runs them, its frames generated between the plan
    and the finish (on another thread there): a subscription removed or replaced meanwhile
    gets no frame of the plan; the others get exactly :meth:`round`'s frames."""
    sim, node = setup()
    twin_sim, twin = setup()
    for each in (node, twin):
        for subscriber, key in ((1, "a"), (2, "b"), (3, "c")):
            each.subscribe(subscriber, key, WHOLE, 0.0, 10.0, None)
    tick(sim, node)
    tick(twin_sim, twin)
    plan = node.plan_round(0.1, budget=10)
    made = plan.generate()
    node.unsubscribe(1, "a")
    node.subscribe(2, "b", SMALL, 0.0, 10.0, None)  # replaced: another region now
    served = node.finish_round(plan, made)
    [expected] = [s for s in twin.round(0.1, budget=10) if s.subscriber == 3]
    [got] = served
    assert (got.subscriber, got.key) == (3, "c")
    _, ids, positions = decode_frame(got.frame.data)
    _, twin_ids, twin_positions = decode_frame(expected.frame.data)
    assert ids.tolist() == twin_ids.tolist() and len(ids) == 300
    assert np.array_equal(positions, twin_positions)
