"""The publisher store of an intermediary (claim 1, [76]-[83]): what it publishes,
subscriber -> its spatial subscriptions, each with a priority and the capabilities the
subscriber declared.

A relative subscription ([72]) is kept relative here and placed at its entity's current
position, read from the state snapshot, whenever the live regions are asked for
(:meth:`PublisherStore.live_regions`, placing with :func:`.placements.place`). An entity that
is not in the state (yet) leaves its subscription unplaced (reported, with the reason)
rather than refused: it may appear next epoch. The state store keys entities by int64, so a
relative subscription must name an integer entity id to be placed.

Memory is bounded: at most ``max_subscribers`` subscribers with at most
``max_per_subscriber`` subscriptions each (a subscribe past either is refused with the bound
named). Removing a subscriber frees its records, so any sequence of subscribes and
unsubscribes stays within the bounds.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tidings.errors import IntermediaryError
from tidings.intermediary.node.generation import Capabilities
from tidings.intermediary.node.placements import place
from tidings.intermediary.node.scheduling import DEFAULT_MAX_PRIORITY
from tidings.intermediary.node.snapshot import Snapshot
from tidings.intermediary.regions.geometry import (
    Box,
    Region,
    Relative,
    Sector,
    Sphere,
    Subscription,
    check_dim,
)

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


def _bound(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000_000:
        raise IntermediaryError(f"{name}: expected an integer in 1..10000000, got {value!r:.40}")
    return value


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
        self.dim = check_dim(dim)
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
