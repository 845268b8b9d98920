"""The routing table: event type -> one or more targets (many-to-many, patent [0034]).

Routes come from two places that are merged: the ``routing.routes`` section of the YAML
configuration and the ``tidings_route`` database table. The relay loads a fresh
:class:`Routes` snapshot at the start of every micro-batch task, so a change to either
takes effect on the next micro-batch without a restart (patent [0055]).

A route's key is an event type, a prefix pattern ending in ``*`` (``orders.*`` routes every
type that starts with ``orders.``) or ``*`` alone (every type). An event goes to the union
of the targets of every key that matches its type; ``routing.default`` names the targets of
a type no key matches (instead of UNROUTABLE). Emit refuses types that hold a ``*``, so a
key is never both a type and a pattern. Where in the target an event lands (a subject, a
type) can depend on its fields: see the targets' destination templates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import Engine, delete, select

from tidings.config import TidingsConfig
from tidings.events.timeutil import utcnow
from tidings.outbox.checks import check_event_type
from tidings.outbox.schema import route


@dataclass(frozen=True)
class Routes:
    """An immutable snapshot of the routing table."""

    by_type: Mapping[str, tuple[str, ...]]
    default: tuple[str, ...] = ()
    _resolved: dict[str, tuple[str, ...]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def targets_for(self, event_type: str) -> tuple[str, ...]:
        """The targets an event type goes to; empty means the event is unroutable.

        Resolved once per type per snapshot: the relay asks for every event.
        """
        targets = self._resolved.get(event_type)
        if targets is None:
            found: dict[str, None] = {}
            for key, names in self.by_type.items():
                if key == event_type or (
                    key.endswith(WILDCARD) and event_type.startswith(key[:-1])
                ):
                    found.update(dict.fromkeys(names))
            targets = self._resolved[event_type] = tuple(found) or self.default
        return targets

    def target_names(self) -> set[str]:
        """Every target some event type goes to."""
        return {name for names in self.by_type.values() for name in names} | set(self.default)


#: A route key ending in it is a prefix pattern; alone, it matches every type.
WILDCARD = "*"


def check_route_key(key: str) -> str:
    """``key`` if it can be a route's key (a type emit accepts, ``prefix*`` or ``*``), else
    EmitError naming it."""
    if key == WILDCARD:
        return key
    check_event_type(key[:-1] if key.endswith(WILDCARD) and len(key) > 1 else key)
    return key


def merge_routes(*sources: Mapping[str, Iterable[str]], default: Iterable[str] = ()) -> Routes:
    """Union of route sources, each type's targets in first-seen order, no repeats."""
    merged: dict[str, list[str]] = {}
    for source in sources:
        for event_type, targets in source.items():
            bucket = merged.setdefault(event_type, [])
            bucket.extend(t for t in targets if t not in bucket)
    return Routes({k: tuple(v) for k, v in merged.items() if v}, tuple(default))


def current_routes(config: TidingsConfig, engine: Engine) -> Routes:
    """The routes in force: the configuration merged with the database table."""
    routing = config.routing
    if routing.use_table:
        return merge_routes(routing.routes, table_routes(engine), default=routing.default)
    return merge_routes(routing.routes, default=routing.default)


def table_routes(engine: Engine) -> dict[str, list[str]]:
    """The enabled routes stored in the ``tidings_route`` table."""
    routes: dict[str, list[str]] = {}
    query = select(route.c.event_type, route.c.target).where(route.c.enabled.is_(True))
    with engine.connect() as conn:
        for event_type, target in conn.execute(query.order_by(route.c.event_type, route.c.target)):
            routes.setdefault(event_type, []).append(target)
    return routes


def add_route(engine: Engine, event_type: str, target: str) -> None:
    """Route ``event_type`` (a type or a pattern) to ``target`` from the next micro-batch on;
    EmitError for a key no event could match (the rules of emit)."""
    check_route_key(event_type)
    with engine.begin() as conn:
        conn.execute(
            delete(route).where(route.c.event_type == event_type, route.c.target == target)
        )
        conn.execute(
            route.insert().values(
                event_type=event_type, target=target, enabled=True, updated_at=utcnow()
            )
        )


def remove_route(engine: Engine, event_type: str, target: str) -> bool:
    """Stop routing ``event_type`` to ``target``; True if such a route existed."""
    with engine.begin() as conn:
        result = conn.execute(
            delete(route).where(route.c.event_type == event_type, route.c.target == target)
        )
    return result.rowcount > 0
