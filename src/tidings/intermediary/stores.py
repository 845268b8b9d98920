"""The publisher store and the subscriber store of an intermediary (claim 1, [76]-[83]).

The **publisher store** is what the intermediary publishes: subscriber -> its spatial
subscriptions, each with a priority and the capabilities the subscriber declared. The
**subscriber store** is what the intermediary itself subscribes to upstream: a set of boxes
(:mod:`.coverage` says why boxes) that together cover every live subscription.

Claim 1 step by step is :func:`subscribe_request`: store the record in the publisher store,
decide whether the upstream boxes cover the new region, and if not, return the boxes to
request upstream -- only the uncovered part (or its neighbourhood, per the
:class:`~tidings.intermediary.coverage.UpstreamPolicy`). Unsubscribing does not re-plan at
once: :func:`~tidings.intermediary.coverage.plan` costs about a millisecond per live region,
so a flood of unsubscribes would be a flood of plans. The subscriber store is marked stale
instead and re-planned when the caller asks (:meth:`SubscriberStore.replan`, e.g. once per
epoch), which shrinks the upstream set to what the live regions need.

A relative subscription ([72]) is kept relative in the publisher store and placed at its
entity's current position, read from the state snapshot, whenever the live regions are
asked for (:meth:`PublisherStore.live_regions`). An entity that is not in the state (yet)
leaves its subscription unplaced (reported, with the reason) rather than refused: it may
appear next epoch. The state store keys entities by int64, so a relative subscription must
name an integer entity id to be placed.

Memory is bounded: at most ``max_subscribers`` subscribers with at most
``max_per_subscriber`` subscriptions each (a subscribe past either is refused with the bound
named), and the upstream set is bounded by the policy's ``max_boxes``. Removing a subscriber
frees its records, so any sequence of subscribes and unsubscribes stays within the bounds.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from tidings.errors import IntermediaryError
from tidings.intermediary import coverage
from tidings.intermediary.coverage import UpstreamPolicy
from tidings.intermediary.coveredcells import CoveredCells
from tidings.intermediary.generation import Capabilities
from tidings.intermediary.geometry import Box, Region, Relative, Sector, Sphere, Subscription
from tidings.intermediary.scheduling import DEFAULT_MAX_PRIORITY
from tidings.intermediary.state import Snapshot

#: Default bounds of a publisher store.
DEFAULT_MAX_SUBSCRIBERS = 100_000
DEFAULT_MAX_PER_SUBSCRIBER = 16
#: The longest name of one subscription within its subscriber.
MAX_KEY_LENGTH = 128


@dataclass(frozen=True)
class SubscriptionRecord:
    """One subscription of one subscriber, as the publisher store keeps it."""

    subscriber: Hashable
    key: str
    subscription: Subscription
    priority: float = 0.0
    capabilities: Capabilities = field(default_factory=Capabilities)


@dataclass(frozen=True)
class Placed:
    """The live regions at one snapshot: each record with its region placed in the world,
    and the relative ones that could not be placed, with why."""

    regions: list[tuple[SubscriptionRecord, Region]]
    unplaced: list[tuple[SubscriptionRecord, str]]

    def only_regions(self) -> list[Region]:
        return [region for _, region in self.regions]


def _check_dim(dim: object) -> int:
    if isinstance(dim, bool) or dim not in (2, 3):
        raise IntermediaryError(f"dim: expected 2 or 3, got {dim!r:.40}")
    return int(dim)  # type: ignore[arg-type]


def _bound(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000_000:
        raise IntermediaryError(f"{name}: expected an integer in 1..10000000, got {value!r:.40}")
    return value


def place(subscription: Subscription, snapshot: Snapshot | None) -> Region | str:
    """``subscription`` placed in the world: a region as it is, a :class:`Relative` one at its
    entity's position in ``snapshot``; or, when it cannot be placed, the reason."""
    if not isinstance(subscription, Relative):
        return subscription
    entity = subscription.entity_id
    if not isinstance(entity, int):
        return f"relative_to: entity id {entity!r:.40} is not an integer (the state keys by int64)"
    if not -(2**63) <= entity < 2**63:
        return f"relative_to: entity id {entity} does not fit in int64"
    if snapshot is None:
        return f"relative_to: no state yet to find entity {entity} in"
    position = snapshot.position_of(entity)
    if position is None:
        return f"relative_to: entity {entity} is not in the state at epoch {snapshot.epoch}"
    return place_at(subscription, position)


def place_at(subscription: Relative, position: Sequence[float]) -> Region | str:
    """A relative subscription placed at its entity's ``position``, or why it cannot be."""
    try:
        return subscription.resolve(position)
    except IntermediaryError as exc:
        return str(exc)


class PublisherStore:
    """Subscriber -> its subscriptions (by key), with priority and capabilities (claim 1's
    publisher data store). All subscriptions share one dimension (the state's)."""

    def __init__(
        self,
        dim: int,
        *,
        max_subscribers: int = DEFAULT_MAX_SUBSCRIBERS,
        max_per_subscriber: int = DEFAULT_MAX_PER_SUBSCRIBER,
        max_priority: float = DEFAULT_MAX_PRIORITY,
    ) -> None:
        self.dim = _check_dim(dim)
        self.max_subscribers = _bound("max_subscribers", max_subscribers)
        self.max_per_subscriber = _bound("max_per_subscriber", max_per_subscriber)
        if (
            isinstance(max_priority, bool)
            or not isinstance(max_priority, (int, float))
            or not (math.isfinite(max_priority) and max_priority > 0)
        ):
            raise IntermediaryError(
                f"max_priority: expected a positive number, got {max_priority!r}"
            )
        self.max_priority = float(max_priority)
        self._subs: dict[Hashable, dict[str, SubscriptionRecord]] = {}
        self._count = 0

    def __len__(self) -> int:
        """The number of subscriptions held."""
        return self._count

    def __contains__(self, subscriber: object) -> bool:
        try:
            return subscriber in self._subs
        except TypeError:
            return False

    def subscribers(self) -> list[Hashable]:
        return list(self._subs)

    def subscriptions(self, subscriber: Hashable) -> Mapping[str, SubscriptionRecord]:
        """The subscriber's subscriptions by key (empty if it has none)."""
        return MappingProxyType(dict(self._subs.get(subscriber, {})))

    def put(
        self,
        subscriber: Hashable,
        key: str,
        subscription: Subscription,
        priority: float = 0.0,
        capabilities: Capabilities | None = None,
    ) -> tuple[SubscriptionRecord, SubscriptionRecord | None]:
        """Add or replace the subscriber's subscription ``key``; returns the new record and
        the one it replaced (None). Refused, naming the problem, when the subscription is not
        a region of this store's dimension, the priority is out of range, or a bound would be
        exceeded; a refusal changes nothing."""
        try:
            hash(subscriber)
        except TypeError:
            raise IntermediaryError(
                f"subscriber: expected a hashable id, got {type(subscriber).__name__}"
            ) from None
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
            raise IntermediaryError(
                f"key: expected a name of 1 to {MAX_KEY_LENGTH} characters, got {key!r:.40}"
            )
        if not isinstance(subscription, (Box, Sphere, Sector, Relative)):
            raise IntermediaryError(
                f"subscription: expected a region, got {type(subscription).__name__}"
            )
        if subscription.dim != self.dim:
            raise IntermediaryError(
                f"subscription: has {subscription.dim} dimensions, the state has {self.dim}"
            )
        if (
            isinstance(priority, bool)
            or not isinstance(priority, (int, float))
            or not 0 <= priority <= self.max_priority  # also refuses NaN
        ):
            raise IntermediaryError(
                f"priority: expected a number in 0..{self.max_priority:g}, got {priority!r:.40}"
            )
        caps = Capabilities() if capabilities is None else capabilities
        if not isinstance(caps, Capabilities):
            raise IntermediaryError(
                f"capabilities: expected Capabilities, got {type(caps).__name__}"
            )
        mine = self._subs.get(subscriber)
        if mine is None and len(self._subs) >= self.max_subscribers:
            raise IntermediaryError(
                f"subscriber: this intermediary serves at most {self.max_subscribers} "
                "subscribers and is full"
            )
        if mine is not None and key not in mine and len(mine) >= self.max_per_subscriber:
            raise IntermediaryError(
                f"key: subscriber {subscriber!r:.40} already has the most subscriptions "
                f"allowed ({self.max_per_subscriber}); unsubscribe one first"
            )
        record = SubscriptionRecord(subscriber, key, subscription, float(priority), caps)
        if mine is None:
            mine = self._subs[subscriber] = {}
        old = mine.get(key)
        mine[key] = record
        if old is None:
            self._count += 1
        return record, old

    def remove(self, subscriber: Hashable, key: str | None = None) -> list[SubscriptionRecord]:
        """Remove one subscription (``key``) or all of the subscriber's; returns what was
        removed (empty when there was nothing: unsubscribing twice is harmless)."""
        mine = self._subs.get(subscriber)
        if mine is None:
            return []
        if key is None:
            removed = list(mine.values())
            mine.clear()
        else:
            record = mine.pop(key, None)
            removed = [] if record is None else [record]
        if not mine:
            del self._subs[subscriber]
        self._count -= len(removed)
        return removed

    def records(self) -> Iterable[SubscriptionRecord]:
        for mine in self._subs.values():
            yield from mine.values()

    def live_regions(self, snapshot: Snapshot | None) -> Placed:
        """Every subscription placed in the world at ``snapshot`` (relative ones at their
        entity's position there), and those that could not be placed, with why."""
        regions: list[tuple[SubscriptionRecord, Region]] = []
        unplaced: list[tuple[SubscriptionRecord, str]] = []
        for record in self.records():
            placed = place(record.subscription, snapshot)
            if isinstance(placed, str):
                unplaced.append((record, placed))
            else:
                regions.append((record, placed))
        return Placed(regions, unplaced)


@dataclass(frozen=True)
class UpstreamDiff:
    """What to change upstream: subscribe to ``added`` first, then drop ``removed`` (the new
    set covers everything the old one did, so nothing is missed in between)."""

    added: list[Box]
    removed: list[Box]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


class SubscriberStore:
    """The intermediary's own upstream subscriptions: boxes that together cover every live
    subscription (claim 1's subscriber data store)."""

    def __init__(
        self,
        dim: int,
        policy: UpstreamPolicy | None = None,
        world: Box | None = None,
    ) -> None:
        self.dim = _check_dim(dim)
        self.policy = UpstreamPolicy.exact() if policy is None else policy
        if not isinstance(self.policy, UpstreamPolicy):
            raise IntermediaryError(
                f"policy: expected an UpstreamPolicy, got {type(self.policy).__name__}"
            )
        if world is not None and (not isinstance(world, Box) or world.dim != self.dim):
            raise IntermediaryError(f"world: expected a {self.dim}D Box, got {world!r:.80}")
        self.world = world
        self._boxes: list[Box] = []
        self._stale = False
        self._covered: tuple[tuple[Box, ...], CoveredCells] | None = None

    @property
    def boxes(self) -> tuple[Box, ...]:
        """The current upstream boxes."""
        return tuple(self._boxes)

    @property
    def stale(self) -> bool:
        """Whether something was unsubscribed since the last :meth:`replan`."""
        return self._stale

    def revert(self, diff: UpstreamDiff) -> None:
        """Undo ``diff`` here, when the publisher did not take it: the boxes it added are
        dropped and those it removed come back (the store says what upstream holds)."""
        added = set(diff.added)
        self._boxes = [b for b in self._boxes if b not in added]
        self._boxes.extend(b for b in diff.removed if b not in self._boxes)

    def _check(self, region: object) -> Region:
        if isinstance(region, Relative):
            raise IntermediaryError(
                "region: a relative region is placed first (at its entity's position)"
            )
        if not isinstance(region, (Box, Sphere, Sector)):
            raise IntermediaryError(f"region: expected a region, got {type(region).__name__}")
        if region.dim != self.dim:
            raise IntermediaryError(
                f"region: has {region.dim} dimensions, the upstream set has {self.dim}"
            )
        return region

    def covers(self, region: Region) -> bool:
        """Whether the upstream boxes cover ``region`` (exact for boxes, conservative for
        spheres and sectors: see :func:`coverage.covers`)."""
        return coverage.covers(self._boxes, self._check(region))

    def subscribe(self, region: Region) -> UpstreamDiff:
        """Cover ``region``: the boxes to request upstream (only the uncovered part, claim 1;
        nothing when it is covered) and those the policy merged away."""
        region = self._check(region)
        new, added = coverage.add(self._boxes, region, self.policy, self.world)
        kept = set(new)
        removed = [box for box in self._boxes if box not in kept]
        self._boxes = list(new)
        return UpstreamDiff(list(added), removed)

    def unsubscribe(self) -> None:
        """Note that a live region went away; the upstream set shrinks at the next
        :meth:`replan` (debounced: planning costs about a millisecond per live region)."""
        self._stale = True

    def replan(self, live_regions: Sequence[Region], force: bool = False) -> UpstreamDiff:
        """Recompute the upstream set from the live regions if something was unsubscribed
        (or ``force``), and return the difference; nothing when it is up to date."""
        if not (self._stale or force):
            return UpstreamDiff([], [])
        regions = [self._check(region) for region in live_regions]
        new = coverage.plan(regions, self.policy, self.world)
        old = set(self._boxes)
        kept = set(new)
        diff = UpstreamDiff(
            [box for box in new if box not in old],
            [box for box in self._boxes if box not in kept],
        )
        self._boxes = list(new)
        self._stale = False
        return diff

    def _cells(self) -> CoveredCells:
        """The quick coverage index of the current boxes (rebuilt when they change)."""
        boxes = tuple(self._boxes)
        if self._covered is None or self._covered[0] != boxes:
            self._covered = (boxes, CoveredCells(boxes))
        return self._covered[1]

    def track(
        self,
        live_regions: Sequence[Region],
        ahead: Sequence[float] | np.ndarray | None = None,
        bounds: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> UpstreamDiff:
        """Cover the live regions that are not covered any more or come close to the edge
        of the upstream set (a relative subscription follows its entity): the subscribe path
        for each, the diffs combined.

        Close means within ``ahead[i]``: how far region ``i`` may move before the next epoch
        (its entity's last step, twice, say). Such a region is covered that much farther
        *before* it reaches past the upstream set, so its next epoch's view is inside what
        upstream already sends. (One that moved farther waits: the intermediary does not
        serve it until upstream sends the new part.) ``bounds``: the regions'
        :func:`bounds_of`, if the caller has them."""
        regions = [self._check(region) for region in live_regions]
        if not regions:
            return UpstreamDiff([], [])
        before = list(self._boxes)
        guards = np.zeros(len(regions))
        if ahead is not None:
            guards = np.maximum(guards, np.asarray(ahead, dtype=np.float64))
        cells = self._cells()
        # Most moving regions are still well inside the upstream set: their bounding boxes
        # answer, all at once; the rest are tested one by one on the same painted grid (as
        # exact as coverage.covers, without cutting and painting a grid per region).
        lo, hi = bounds if bounds is not None else bounds_of(regions)
        clear = cells.covers_bounds(lo - guards[:, None], hi + guards[:, None])
        for i, region in enumerate(regions):
            if clear[i]:
                continue
            guard = float(guards[i])
            covered = cells.covers_region(region)
            if covered and not guard:
                continue
            if self.subscribe(_grown(region, guard) if guard else region):
                cells = self._cells()  # the upstream set grew
        old, kept = set(before), set(self._boxes)
        return UpstreamDiff(
            [box for box in self._boxes if box not in old],
            [box for box in before if box not in kept],
        )


def bounds_of(regions: Sequence[Region]) -> tuple[np.ndarray, np.ndarray]:
    """The regions' bounding boxes as ``lo`` and ``hi`` rows, for
    :meth:`.coveredcells.CoveredCells.covers_bounds`."""
    los: list[Sequence[float]] = []
    his: list[Sequence[float]] = []
    for region in regions:
        if isinstance(region, Sphere):  # the numbers Sphere.bounds gives, without a Box
            r = region.radius
            los.append([x - r for x in region.center])
            his.append([x + r for x in region.center])
        else:
            box = region.bounds()
            los.append(box.lo)
            his.append(box.hi)
    lo = np.array(los, dtype=np.float64).reshape(len(los), -1)
    hi = np.array(his, dtype=np.float64).reshape(len(his), -1)
    return lo, hi


def _grown(region: Region, by: float) -> Box:
    """The bounding box of ``region`` grown by ``by`` on every side (what a region close to
    the edge of the upstream set asks for ahead of time)."""
    bounds = region.bounds()
    return Box(tuple(x - by for x in bounds.lo), tuple(x + by for x in bounds.hi))


@dataclass(frozen=True)
class SubscribeOutcome:
    """What a subscribe request did: the record stored, the one it replaced, where the
    region was placed (or why it could not be), whether upstream already covered it, and
    what to change upstream."""

    record: SubscriptionRecord
    replaced: SubscriptionRecord | None
    region: Region | None
    unplaced: str | None
    covered: bool
    upstream: UpstreamDiff


def subscribe_request(
    publishers: PublisherStore,
    upstream: SubscriberStore,
    snapshot: Snapshot | None,
    subscriber: Hashable,
    key: str,
    subscription: Subscription,
    priority: float = 0.0,
    capabilities: Capabilities | None = None,
) -> SubscribeOutcome:
    """Claim 1, step by step: (1) the request is validated and (2) recorded in the publisher
    store; (3) its region is placed (a relative one at its entity's position) and (4) checked
    against the upstream boxes; (5) only if they do not cover it, the uncovered part becomes
    the upstream request (and is recorded in the subscriber store).

    Replacing a subscription marks the subscriber store stale (the old region may no longer
    be needed). A relative region whose entity is not in the state is recorded but not
    placed; :meth:`SubscriberStore.track` covers it once it appears. A request refused at any
    step leaves both stores as they were.
    """
    if publishers.dim != upstream.dim:
        raise IntermediaryError(
            f"stores: the publisher store is {publishers.dim}D, the subscriber store "
            f"{upstream.dim}D"
        )
    record, replaced = publishers.put(subscriber, key, subscription, priority, capabilities)
    placed = place(subscription, snapshot)
    if isinstance(placed, str):
        if replaced is not None:
            upstream.unsubscribe()
        return SubscribeOutcome(record, replaced, None, placed, False, UpstreamDiff([], []))
    try:
        covered = upstream.covers(placed)
        diff = UpstreamDiff([], []) if covered else upstream.subscribe(placed)
    except IntermediaryError:
        # Coverage could not be decided (or the region does not fit the upstream set): the
        # request is refused as a whole, so the publisher store is as it was.
        publishers.remove(subscriber, key)
        if replaced is not None:
            publishers.put(
                subscriber, key, replaced.subscription, replaced.priority, replaced.capabilities
            )
        raise
    if replaced is not None:
        upstream.unsubscribe()
    return SubscribeOutcome(record, replaced, placed, None, covered, diff)


def unsubscribe_request(
    publishers: PublisherStore,
    upstream: SubscriberStore,
    subscriber: Hashable,
    key: str | None = None,
) -> list[SubscriptionRecord]:
    """Remove one subscription (or all of a subscriber's) and mark the upstream set for
    re-planning; returns the records removed."""
    removed = publishers.remove(subscriber, key)
    if removed:
        upstream.unsubscribe()
    return removed


def replan(
    publishers: PublisherStore, upstream: SubscriberStore, snapshot: Snapshot | None
) -> UpstreamDiff:
    """Re-plan the upstream set over the live regions placed at ``snapshot`` (if stale; the
    regions are not even placed otherwise: this runs every epoch)."""
    if not upstream.stale:
        return UpstreamDiff([], [])
    return upstream.replan(publishers.live_regions(snapshot).only_regions())


__all__ = [
    "Placed",
    "PublisherStore",
    "SubscribeOutcome",
    "SubscriberStore",
    "SubscriptionRecord",
    "UpstreamDiff",
    "place",
    "replan",
    "subscribe_request",
    "unsubscribe_request",
]
