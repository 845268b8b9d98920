"""Claim 1 step by step, wired through both stores of an intermediary: the subscribe path
(:func:`subscribe_request`: store the record in the publisher store, decide whether the
upstream boxes cover the new region, and if not, return the boxes to request upstream --
only the uncovered part), the unsubscribe path (:func:`unsubscribe_request`: the subscriber
store is marked stale) and the re-plan that shrinks the upstream set (:func:`replan`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from tidings.errors import IntermediaryError
from tidings.intermediary.node.generation import Capabilities
from tidings.intermediary.node.placements import place
from tidings.intermediary.node.publisher_store import PublisherStore, SubscriptionRecord
from tidings.intermediary.node.snapshot import Snapshot
from tidings.intermediary.node.subscriber_store import SubscriberStore, UpstreamDiff
from tidings.intermediary.regions.geometry import Region, Subscription


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
