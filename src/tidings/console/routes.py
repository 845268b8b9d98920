"""The routing table as the console's routes page shows it: every route in force with where
it comes from (the file, the ``tidings_route`` table, or both), the default route, and the
UNROUTABLE events each route's key matches (which a re-drive would send).

The routes are those :func:`~tidings.routing.table.current_routes` merges for the relay;
the counts are :meth:`IncompleteEvents.count <tidings.outbox.incomplete.IncompleteEvents.count>`
of UNROUTABLE events of the key (the status index: UNROUTABLE events wait for an operator,
so they are few).
"""

from __future__ import annotations

from dataclasses import dataclass

from tidings.config import TidingsConfig
from tidings.events.outbox import EventStatus
from tidings.outbox.incomplete import EventFilter, IncompleteEvents
from tidings.routing.table import current_routes, table_routes

UNROUTABLE = frozenset({EventStatus.UNROUTABLE})


@dataclass(frozen=True)
class RouteRow:
    """One key of the routing table in force."""

    key: str
    targets: tuple[str, ...]
    in_file: tuple[str, ...]
    in_table: tuple[str, ...]
    unroutable: int


@dataclass(frozen=True)
class RoutingView:
    rows: list[RouteRow]
    default: tuple[str, ...]
    use_table: bool
    unroutable: int


def routing_view(config: TidingsConfig, events: IncompleteEvents) -> RoutingView:
    """The routes in force, each with its sources and matching UNROUTABLE events."""
    engine = events.engine
    routing = config.routing
    table = table_routes(engine) if routing.use_table else {}
    in_force = current_routes(config, engine)
    rows = [
        RouteRow(
            key,
            targets,
            tuple(routing.routes.get(key, ())),
            tuple(table.get(key, ())),
            unroutable_matching(events, key),
        )
        for key, targets in sorted(in_force.by_type.items())
    ]
    total = events.count(EventFilter(statuses=UNROUTABLE))
    return RoutingView(rows, in_force.default, routing.use_table, total)


def unroutable_matching(events: IncompleteEvents, key: str) -> int:
    """How many UNROUTABLE events a route of ``key`` (a type, ``prefix*`` or ``*``) matches."""
    return events.count(EventFilter(statuses=UNROUTABLE, event_type=key))
