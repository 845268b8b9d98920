"""What one subscriber may subscribe to, and the checks that refuse the rest (issue 30).

A :class:`Grant` is an identity's name with its allowed event types (Hat patterns), tables
and regions, built from the configuration (:mod:`tidings.config.intermediary_access`). Each
check raises a :class:`~tidings.errors.SubscriptionRefused` naming the identity and what it
may not have; the caller answers that request with it and the connection goes on serving
the subscriptions that were allowed.

The decisions are exact where they can be and otherwise refuse:

* **events** -- allowed when the granted patterns together cover each requested pattern
  (:func:`.patterns.covers_all`: ``[app, '*']`` is covered by ``[[app, orders, '*'],
  [app, '*']]``, and ``[app, '*']`` is not covered by ``[app, orders, '*']``, which would
  leave out ``[app, users]``). A decision too costly to finish says "not covered", so a
  crafted pattern is refused, never let through.
* **tables** -- every table a view reads (joins included, after the view's own checks) must
  be granted.
* **regions** -- the region must lie inside the union of the granted boxes
  (:func:`.regions.coverage.covers`, exact for a box and conservative for a sphere or a
  sector). A region relative to an entity moves with it, so it is allowed only to a grant
  of every region.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tidings.errors import SubscriptionRefused
from tidings.events.matching import QueryType
from tidings.intermediary.regions.coverage import covers
from tidings.intermediary.regions.geometry import Box, Relative, Subscription
from tidings.intermediary.views.patterns import covers_all

#: "Everything of this kind" (configured as ``'*'``).
ALL = None


def _shown(pattern: QueryType) -> str:
    return "[" + ", ".join(pattern) + "]"


@dataclass(frozen=True)
class Grant:
    """``identity`` may subscribe to the event types ``events`` covers, read ``tables`` and
    subscribe regions inside ``regions`` (each :data:`ALL`, None, for everything). Table
    names are lowercase, as the SQL catalog keeps them."""

    identity: str
    events: tuple[QueryType, ...] | None = ALL
    tables: frozenset[str] | None = ALL
    regions: tuple[Box, ...] | None = ALL

    @classmethod
    def everything(cls, identity: str) -> Grant:
        """A grant of every type, table and region (anonymous clients on a machine that
        allows them, the members of a tier to each other)."""
        return cls(identity)

    @classmethod
    def of(
        cls,
        identity: str,
        events: Iterable[QueryType],
        tables: Iterable[str],
        regions: str | Iterable[tuple[Iterable[float], Iterable[float]]],
    ) -> Grant:
        """A grant as configured: patterns (``[('*',)]`` is every type), table names (``*``
        for all) and ``'*'`` or boxes as ``(lo, hi)``."""
        patterns = tuple(events)
        names = frozenset(name.lower() for name in tables)
        return cls(
            identity,
            ALL if ("*",) in patterns else patterns,
            ALL if "*" in names else names,
            ALL
            if isinstance(regions, str)
            else tuple(Box(tuple(lo), tuple(hi)) for lo, hi in regions),
        )

    def _refuse(self, what: str, allowed: str) -> SubscriptionRefused:
        return SubscriptionRefused(
            f"subscriber {self.identity!r} may not subscribe to {what} (allowed: {allowed})"
        )

    def check_events(self, patterns: Iterable[QueryType]) -> None:
        """Refuse the first pattern the granted ones do not cover."""
        if self.events is ALL:
            return
        for pattern in patterns:
            if not covers_all(self.events, [pattern]):
                allowed = ", ".join(_shown(p) for p in self.events) or "no event types"
                raise self._refuse(f"events {_shown(pattern)}", allowed)

    def check_tables(self, tables: Iterable[str]) -> None:
        """Refuse the first table that is not granted."""
        if self.tables is ALL:
            return
        for table in sorted(tables):
            if table.lower() not in self.tables:
                allowed = ", ".join(sorted(self.tables)) or "no tables"
                raise self._refuse(f"table {table}", allowed)

    def check_region(self, region: Subscription) -> None:
        """Refuse a region outside the granted boxes, and any region relative to an entity
        unless every region is granted."""
        if self.regions is ALL:
            return
        allowed = "; ".join(f"box {list(b.lo)}..{list(b.hi)}" for b in self.regions) or "no regions"
        if isinstance(region, Relative):
            raise self._refuse(
                f"a region relative to entity {region.entity_id!r} (it moves with the entity, "
                "so only a grant of every region allows it)",
                allowed,
            )
        boxes = [box for box in self.regions if box.dim == region.dim]
        if not covers(boxes, region):
            bounds = region.bounds()
            raise self._refuse(f"the region {list(bounds.lo)}..{list(bounds.hi)}", allowed)


#: The grant of no identity: nothing (what a connection holds until it proved one).
NOTHING = Grant("nobody", (), frozenset(), ())
