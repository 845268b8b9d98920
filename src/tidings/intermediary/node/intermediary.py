"""The intermediary itself: the stores, the state, the scheduler and generation wired
together (claim 1, [76]-[93], [138]-[151]).

:class:`Intermediary` is transport-free and single-writer: the caller (the WebSocket
server in :mod:`.transport`, or a test) hands it subscribe and unsubscribe requests,
upstream update batches, epoch ends and generation rounds, from one thread or one event
loop. Everything it refuses is an :class:`~tidings.errors.IntermediaryError` (the
scheduler's usage errors are converted at this edge), so a transport catches one type and
answers the subscriber that sent the bad request while the others go on.

A subscriber is scheduled once whatever number of subscriptions it holds; when it is due,
each of its subscriptions (by key) gets one frame, so a round returns
``(subscriber, key, frame)`` triples. The wire frame carries no key: the transport adds it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tidings.errors import IntermediaryError, UsageError
from tidings.intermediary.node.applied import AppliedBoxes
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.generation import (
    Capabilities,
    Frame,
    LastFrames,
    empty_frame,
    generate,
)
from tidings.intermediary.node.placements import Placements, place
from tidings.intermediary.node.publisher_store import PublisherStore, SubscriptionRecord
from tidings.intermediary.node.roundgen import generate_round
from tidings.intermediary.node.scheduling import Scheduler, SubscriberStatus
from tidings.intermediary.node.snapshot import Snapshot
from tidings.intermediary.node.state import StateStore
from tidings.intermediary.node.subscribe import (
    SubscribeOutcome,
    replan,
    subscribe_request,
    unsubscribe_request,
)
from tidings.intermediary.node.subscriber_store import SubscriberStore, UpstreamDiff
from tidings.intermediary.regions.coverage import UpstreamPolicy
from tidings.intermediary.regions.coveredcells import bounds_of
from tidings.intermediary.regions.geometry import Box, Region, Relative, Subscription, parse_region
from tidings.intermediary.regions.grid import GridIndex

#: The longest subscription key accepted (it travels in every frame's envelope).
MAX_KEY_BYTES = 64
#: The highest rate a subscriber may ask for.
MAX_RATE_HZ = 1000.0


def check_schedule(priority: object, rate_hz: object, max_priority: float) -> tuple[float, float]:
    """A subscription's priority and rate, checked before anything changes upstream, so the
    scheduler cannot refuse them later."""
    if (
        isinstance(priority, bool)
        or not isinstance(priority, (int, float))
        or not 0 <= priority <= max_priority
    ):
        raise IntermediaryError(
            f"priority: expected a number in [0, {max_priority}], got {priority!r:.40}"
        )
    if (
        isinstance(rate_hz, bool)
        or not isinstance(rate_hz, (int, float))
        or not 0 < rate_hz <= MAX_RATE_HZ  # NaN fails; an int beyond float is compared
    ):
        raise IntermediaryError(
            f"rate_hz: expected a number in (0, {MAX_RATE_HZ}], got {rate_hz!r:.40}"
        )
    return float(priority), float(rate_hz)


@dataclass(frozen=True)
class RoundPlan:
    """A round decided (:meth:`Intermediary.plan_round`): the snapshot, the distinct views
    its due subscriptions need, and per subscription its view's index or a frame made
    already. :meth:`generate` is the round's heavy part, pure over the snapshot."""

    snapshot: Snapshot | None
    views: list[tuple[Region, Capabilities, tuple[float, ...] | None]]
    pending: list[tuple[Hashable, str, SubscriptionRecord, Frame | int]]
    grid: Callable[[Snapshot], GridIndex]

    def generate(self) -> list[Frame]:
        """Every view's frame, in :attr:`views`' order."""
        if self.snapshot is None or not self.views:
            return []
        return generate_round(self.snapshot, self.grid(self.snapshot), self.views)


class Upstream(Protocol):
    """What an intermediary subscribes to: a publisher (a :class:`.simulation.SimulationFeed`,
    or another intermediary) that takes boxes and later delivers the state inside them."""

    def subscribe(self, boxes: Sequence[Box]) -> None: ...

    def unsubscribe(self, boxes: Sequence[Box]) -> None: ...

    def follow(self, entities: frozenset[int]) -> None:
        """Deliver these entities wherever they are, besides the boxes (replacing the set
        given before): the entities of relative regions, which must be in the state before
        their regions can be placed and covered."""
        ...


def requests_of(upstream: object) -> tuple[int, int] | None:
    """An upstream's ``(requested, applied)`` counts, if it keeps them: the operations asked
    so far, and how many of them the batches handed over so far reflect. An upstream that
    applies requests later than the next batch (one in another process) must keep them, so
    the intermediary never serves a view from state its upstream did not fill yet."""
    requested = getattr(upstream, "requested", None)
    applied = getattr(upstream, "applied", None)
    if isinstance(requested, int) and isinstance(applied, int):
        return requested, applied
    return None


@dataclass(frozen=True)
class Served:
    """One frame of one round: for ``subscriber``'s subscription ``key``."""

    subscriber: Hashable
    key: str
    frame: Frame


class Intermediary:
    """One intermediary: publisher store, subscriber store, state, scheduler, last frames."""

    def __init__(
        self,
        dim: int,
        upstream: Upstream,
        *,
        world: Box | None = None,
        policy: UpstreamPolicy | None = None,
        scheduler: Scheduler | None = None,
        state: StateStore | None = None,
        publishers: PublisherStore | None = None,
    ) -> None:
        self.dim = dim
        self.upstream = upstream
        self.state = state if state is not None else StateStore(dim)
        if self.state.dim != dim:
            raise IntermediaryError(
                f"intermediary: the state store is {self.state.dim}D, not {dim}D"
            )
        self.publishers = publishers if publishers is not None else PublisherStore(dim)
        self.subscriptions = SubscriberStore(dim, policy, world)
        self.scheduler = scheduler if scheduler is not None else Scheduler()
        self.last = LastFrames()
        #: Optional: the state a subscription's view is generated from, given the own
        #: snapshot (the cluster merges peers' states here for a view spanning several
        #: intermediaries' areas, claim 9); None: the own snapshot.
        #: It may return None: nothing newer for this subscription this round.
        self.compose: Callable[[SubscriptionRecord, Snapshot], Snapshot | None] | None = None
        self._index: tuple[int, GridIndex] | None = None
        #: The entities upstream was last asked to follow (:meth:`_follow`).
        self._followed: frozenset[int] = frozenset()
        self._placements = Placements()
        #: Subscriptions whose region the state does not cover yet: (subscriber, key) -> the
        #: upstream request count that covers it; not served until the batches reflect it.
        self._awaiting: dict[tuple[Hashable, str], int] = {}
        self._applied = AppliedBoxes()
        #: Each moving region's bounds at the last epoch (its step, :meth:`_steps`).
        self._centres: dict[tuple[Hashable, str], np.ndarray] = {}

    # -- subscribers -------------------------------------------------------------------

    def subscribe(
        self,
        subscriber: Hashable,
        key: str,
        spec: object,
        priority: float = 0.0,
        rate_hz: float = 10.0,
        capabilities: object = None,
    ) -> SubscribeOutcome:
        """Subscribe (or replace) ``subscriber``'s subscription ``key`` to the region
        ``spec`` (:func:`.geometry.parse_region`'s wire form); what upstream must add is
        requested at once (claim 1). ``capabilities`` is a :class:`Capabilities` or its wire
        form."""
        if not isinstance(key, str) or not key or len(key.encode()) > MAX_KEY_BYTES:
            raise IntermediaryError(
                f"key: expected a non-empty string of at most {MAX_KEY_BYTES} bytes"
            )
        priority, rate_hz = check_schedule(priority, rate_hz, self.scheduler.max_priority)
        subscription = parse_region(spec)
        if isinstance(subscription, Relative) and not (
            isinstance(subscription.entity_id, int) and -(2**63) <= subscription.entity_id < 2**63
        ):
            raise IntermediaryError(
                f"relative_to: expected an int64 entity id (the state keys entities by int64), "
                f"got {subscription.entity_id!r:.40}"
            )
        caps = (
            capabilities
            if isinstance(capabilities, Capabilities)
            else Capabilities.parse(capabilities)
        )
        if caps.relative and not isinstance(subscription, Relative):
            raise IntermediaryError(
                "capabilities.relative: relative coordinates need a region relative_to an entity"
            )
        outcome = subscribe_request(
            self.publishers,
            self.subscriptions,
            self.state.snapshot(),
            subscriber,
            key,
            subscription,
            float(priority),
            caps,
        )
        try:
            self._push(outcome.upstream)
            if isinstance(subscription, Relative):  # a new entity to follow, at once
                self._follow(r.subscription for r in self.publishers.records())
        except Exception as exc:  # the publisher refused or failed: the request is undone
            self._undo(subscriber, key, outcome)
            raise IntermediaryError(
                f"upstream: the publisher did not take the subscription: {exc}"
            ) from exc
        top = max(r.priority for r in self.publishers.subscriptions(subscriber).values())
        try:
            if self._scheduled(subscriber):
                self.scheduler.set_priority(subscriber, top)
                self.scheduler.set_rate(subscriber, float(rate_hz))
            else:
                self.scheduler.add(subscriber, top, float(rate_hz))
        except UsageError as exc:
            unsubscribe_request(self.publishers, self.subscriptions, subscriber, key)
            raise IntermediaryError(f"schedule: {exc}") from None
        if outcome.replaced is not None:
            self.last.forget((subscriber, key))
        if outcome.region is not None:
            self._await_upstream([(subscriber, key)], [outcome.region])
        return outcome

    def unsubscribe(self, subscriber: Hashable, key: str | None = None) -> int:
        """Drop one subscription (or, with ``key`` None, all of the subscriber's); upstream
        shrinks at the next :meth:`end_epoch`. Returns how many were removed."""
        removed = unsubscribe_request(self.publishers, self.subscriptions, subscriber, key)
        for record in removed:
            self.last.forget((subscriber, record.key))
            self._awaiting.pop((subscriber, record.key), None)
        if not self.publishers.subscriptions(subscriber) and self._scheduled(subscriber):
            self.scheduler.remove(subscriber)
        return len(removed)

    def set_ready(self, subscriber: Hashable, ready: bool) -> None:
        """Whether ``subscriber``'s channel can take a frame now (ignored when it is not
        scheduled: it has no subscription or was reported for disconnection)."""
        if self._scheduled(subscriber):
            self.scheduler.set_ready(subscriber, ready)

    def take_disconnects(self) -> list[tuple[Hashable, str]]:
        """Subscribers to disconnect, with the reason (too many frames dropped)."""
        return self.scheduler.take_disconnects()

    def status(self, subscriber: Hashable) -> SubscriberStatus:
        try:
            return self.scheduler.info(subscriber)
        except UsageError as exc:
            raise IntermediaryError(f"schedule: {exc}") from None

    def _scheduled(self, subscriber: Hashable) -> bool:
        # Membership, not info(): the serving path asks twice per frame.
        try:
            return subscriber in self.scheduler
        except TypeError:  # unhashable: never scheduled
            return False

    # -- upstream and epochs -----------------------------------------------------------

    def apply(self, batch: UpdateBatch) -> None:
        """An update from upstream, into the inert buffer (invisible until :meth:`end_epoch`)."""
        self.state.apply(batch)

    def end_epoch(self, epoch: int | None = None) -> int:
        """Make the epoch's updates visible, then bring the upstream set up to date: re-plan
        once if something was unsubscribed, and cover relative regions where their entities
        are now. Returns the new epoch (``epoch``, the publisher's tick, if given)."""
        try:
            epoch = self.state.end_epoch(epoch)
        except UsageError as exc:
            raise IntermediaryError(f"epoch: {exc}") from None
        counts = requests_of(self.upstream)
        if counts is not None and self._awaiting:
            applied = counts[1]
            self._awaiting = {k: n for k, n in self._awaiting.items() if n > applied}
        snapshot = self.state.snapshot()
        self._push(replan(self.publishers, self.subscriptions, snapshot))
        # Only relative regions move; placing every region each epoch cost more than the rest.
        records = [
            record
            for record in self.publishers.records()
            if isinstance(record.subscription, Relative)
        ]
        relative = [record.subscription for record in records]
        self._placements.place_all(relative, snapshot)
        moving = []
        for record in records:
            region = self._placements.place(record.subscription, snapshot)[0]
            if not isinstance(region, str):
                moving.append((record, region))
        if moving:
            idents = [(record.subscriber, record.key) for record, _ in moving]
            regions = [region for _, region in moving]
            bounds = bounds_of(regions)
            ahead = self._steps(idents, bounds)
            self._push(self.subscriptions.track(regions, ahead, bounds))
            self._await_upstream(idents, regions, bounds)
        self._follow(relative)
        try:
            self.scheduler.state_updated(epoch)
        except UsageError as exc:
            raise IntermediaryError(f"schedule: {exc}") from None
        return epoch

    def _undo(self, subscriber: Hashable, key: str, outcome: SubscribeOutcome) -> None:
        """Both stores as they were before a subscription upstream did not take."""
        self.subscriptions.revert(outcome.upstream)
        self.publishers.remove(subscriber, key)
        old = outcome.replaced
        if old is not None:
            self.publishers.put(subscriber, key, old.subscription, old.priority, old.capabilities)

    def _follow(self, subscriptions: Iterable[Subscription]) -> None:
        """Ask upstream for exactly the entities of the relative regions among
        ``subscriptions`` (every live one; when that set changed): without it, one whose
        entity no other subscription covers is never placed. Entities no longer needed are
        dropped at the next :meth:`end_epoch`, like boxes."""
        entities = frozenset(
            int(subscription.entity_id)
            for subscription in subscriptions
            if isinstance(subscription, Relative)
        )
        if entities != self._followed:
            self.upstream.follow(entities)
            self._followed = entities

    def _push(self, diff: UpstreamDiff) -> None:
        """Subscribe to the added boxes first, then drop the removed ones (nothing missed)."""
        if diff.added:
            self.upstream.subscribe(diff.added)
        if diff.removed:
            self.upstream.unsubscribe(diff.removed)
        counts = requests_of(self.upstream)
        if diff and counts is not None:
            self._applied.sent(counts[0], self.subscriptions.boxes)

    def _steps(
        self, idents: list[tuple[Hashable, str]], bounds: tuple[np.ndarray, np.ndarray]
    ) -> np.ndarray:
        """How far each moving region may move before the next epoch: twice its last step
        (the largest axis of its centre's move since the previous epoch), so it is covered
        ahead of where its entity goes (:meth:`.subscriber_store.SubscriberStore.track`)."""
        centres = (bounds[0] + bounds[1]) / 2
        last = self._centres
        previous = np.array(
            [last.get(ident, centre) for ident, centre in zip(idents, centres, strict=True)]
        ).reshape(centres.shape)
        self._centres = dict(zip(idents, centres, strict=True))
        steps: np.ndarray = 2 * np.abs(centres - previous).max(axis=1, initial=0.0)
        return steps

    def _await_upstream(
        self,
        idents: list[tuple[Hashable, str]],
        regions: list[Region],
        bounds: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Hold back the subscriptions whose placed region the boxes upstream already
        applied do not cover, until the batches reflect the requests made so far
        (:mod:`.applied`); for an upstream that does not count its requests, none."""
        counts = requests_of(self.upstream)
        if counts is None:
            return
        requested, applied = counts
        for i in self._applied.uncovered(regions, applied, bounds):
            self._awaiting[idents[i]] = requested

    # -- generation --------------------------------------------------------------------

    def round(self, now: float, budget: int) -> list[Served]:
        """One generation round: up to ``budget`` due subscribers, one frame per
        subscription, from one snapshot. A relative subscription whose entity is not in the
        state gets the EMPTY frame."""
        plan = self.plan_round(now, budget)
        return self.finish_round(plan, plan.generate())

    def plan_round(self, now: float, budget: int) -> RoundPlan:
        """A round's first part (:meth:`round` is all three): who is due and which views
        they need. Its :meth:`RoundPlan.generate` may then run on another thread while this
        one goes on taking subscribes, unsubscribes and readiness, but no upstream batch or
        epoch end, until :meth:`finish_round`."""
        try:
            due = self.scheduler.due(now, budget)
        except UsageError as exc:
            raise IntermediaryError(f"schedule: {exc}") from None
        if not due:
            return RoundPlan(None, [], [], self._grid)
        snapshot = self.state.snapshot()
        # Subscribers asking for the same view (region, capabilities, own position) in one
        # round share one selection and one encoding; the round's views of the snapshot are
        # generated together (roundgen), the rest (composed states, EMPTY) one by one.
        views: dict[tuple[Region, Capabilities, tuple[float, ...] | None], int] = {}
        pending: list[tuple[Hashable, str, SubscriptionRecord, Frame | int]] = []
        for subscriber in due:
            records: Mapping[str, SubscriptionRecord] = self.publishers.subscriptions(subscriber)
            for key, record in records.items():
                if self._awaiting and (subscriber, key) in self._awaiting:
                    continue  # its upstream request is not in the state yet
                state = snapshot if self.compose is None else self.compose(record, snapshot)
                if state is None:
                    continue
                if state is snapshot:
                    region, own = self._placements.place(record.subscription, state)
                else:
                    region, own = place(record.subscription, state), None
                    if isinstance(record.subscription, Relative):
                        own = state.position_of(record.subscription.entity_id)  # type: ignore[arg-type]
                if isinstance(region, str):
                    frame = empty_frame(int(state.epoch), self.dim, state.tick, state.tick_time)
                    pending.append((subscriber, key, record, frame))
                    continue
                if state is not snapshot:  # composed from several members' states
                    frame = generate(state, region, record.capabilities, own)
                    pending.append((subscriber, key, record, frame))
                else:
                    view = (region, record.capabilities, None if own is None else tuple(own))
                    pending.append((subscriber, key, record, views.setdefault(view, len(views))))
        return RoundPlan(snapshot, list(views), pending, self._grid)

    def finish_round(self, plan: RoundPlan, made: Sequence[Frame]) -> list[Served]:
        """A round's last part: the frames of ``plan`` (``made``: its generated views), each
        against the subscription's last frame; a subscription removed or replaced since the
        plan gets none."""
        served = []
        for subscriber, key, record, x in plan.pending:
            if self.publishers.subscriptions(subscriber).get(key) is not record:
                continue
            frame = made[x] if isinstance(x, int) else x
            served.append(Served(subscriber, key, self.last.filter((subscriber, key), frame)))
        return served

    def _grid(self, snapshot: Snapshot) -> GridIndex:
        """The grid index of this epoch's positions, built once per epoch."""
        if self._index is None or self._index[0] != snapshot.epoch:
            self._index = (snapshot.epoch, GridIndex(snapshot.positions))
        return self._index[1]
