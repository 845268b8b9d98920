"""The subscriber store of an intermediary (claim 1, [76]-[83]): what the intermediary itself
subscribes to upstream, a set of boxes (:mod:`.coverage` says why boxes) that together cover
every live subscription.

Subscribing covers only what is not covered already (:meth:`SubscriberStore.subscribe`: the
uncovered part, or its neighbourhood, per the
:class:`~tidings.intermediary.regions.coverage.UpstreamPolicy`). Unsubscribing does not
re-plan at once: :func:`~tidings.intermediary.regions.coverage.plan` costs about a
millisecond per live region, so a flood of unsubscribes would be a flood of plans. The store
is marked stale instead and re-planned when the caller asks (:meth:`SubscriberStore.replan`,
e.g. once per epoch), which shrinks the upstream set to what the live regions need. Moving
regions are kept covered ahead of their entities (:meth:`SubscriberStore.track`). The
upstream set is bounded by the policy's ``max_boxes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tidings.errors import IntermediaryError
from tidings.intermediary.regions import coverage
from tidings.intermediary.regions.coverage import UpstreamPolicy
from tidings.intermediary.regions.coveredcells import CoveredCells, bounds_of
from tidings.intermediary.regions.geometry import Box, Region, Relative, Sector, Sphere, check_dim


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
        self.dim = check_dim(dim)
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


def _grown(region: Region, by: float) -> Box:
    """The bounding box of ``region`` grown by ``by`` on every side (what a region close to
    the edge of the upstream set asks for ahead of time)."""
    bounds = region.bounds()
    return Box(tuple(x - by for x in bounds.lo), tuple(x + by for x in bounds.hi))
