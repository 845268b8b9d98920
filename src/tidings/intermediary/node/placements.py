"""Relative subscriptions placed once per epoch.

A relative region follows its entity: placing it is finding the entity in the state and
translating the region there. The epoch's end places every one (to keep them covered
upstream) and every generation round of that epoch needs the same placements again (and
the entity's position, for relative coordinates): with a thousand subscribers, a quarter
of them relative, doing it per use cost more than generating the views. :class:`Placements`
places each relative subscription once per epoch of the intermediary's own state, finding
all their entities with one lookup, and answers exactly what :func:`place` and
:meth:`.snapshot.Snapshot.position_of` would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from tidings.errors import IntermediaryError
from tidings.intermediary.node.snapshot import Snapshot
from tidings.intermediary.regions.geometry import Region, Relative, Subscription


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


def place_at(subscription: Relative, position: Sequence[float] | np.ndarray) -> Region | str:
    """A relative subscription placed at its entity's ``position``, or why it cannot be."""
    try:
        return subscription.resolve(position)
    except IntermediaryError as exc:
        return str(exc)


#: A placement: the region (or why it could not be placed) and the entity's position.
Placement = tuple[Region | str, np.ndarray | None]


class Placements:
    """The placements at one epoch of one state (its epochs only grow, so the epoch names
    the state's content); another epoch's snapshot starts afresh."""

    def __init__(self) -> None:
        self._epoch: int | None = None
        self._placed: dict[Relative, Placement] = {}

    def place_all(self, subscriptions: Iterable[Subscription], snapshot: Snapshot) -> None:
        """Place the relative ones of ``subscriptions`` not yet placed at this epoch."""
        self._at(snapshot)
        todo = {s for s in subscriptions if isinstance(s, Relative) and s not in self._placed}
        # Integer ids are looked up together; anything else (and a miss) as place() says.
        ints = [s for s in todo if type(s.entity_id) is int and -(2**63) <= s.entity_id < 2**63]
        rows = snapshot.rows_of([s.entity_id for s in ints]).tolist() if ints else []
        for subscription, row in zip(ints, rows, strict=True):
            if row >= 0:
                position = snapshot.positions[row]
                region = place_at(subscription, position)
                own = None if isinstance(region, str) else position
                self._placed[subscription] = (region, own)
        for subscription in todo:
            if subscription not in self._placed:
                self._placed[subscription] = (place(subscription, snapshot), None)

    def place(self, subscription: Subscription, snapshot: Snapshot) -> Placement:
        """``subscription`` placed at ``snapshot`` and its entity's position (None for an
        absolute region, or one that could not be placed)."""
        if not isinstance(subscription, Relative):
            return subscription, None
        self._at(snapshot)
        placed = self._placed.get(subscription)
        if placed is None:
            self.place_all([subscription], snapshot)
            placed = self._placed[subscription]
        return placed

    def _at(self, snapshot: Snapshot) -> None:
        if snapshot.epoch != self._epoch:
            self._placed.clear()
            self._epoch = snapshot.epoch
