"""The producer's view of the targets: emit-time refusals, excluded events, and the
incomplete events with the targets each is owed (:func:`incomplete_events_from_config`).

An outbox built from a configuration (:func:`outbox_from_config`) knows where each event
type is routed. It uses that
twice. At emit, it asks every routed target whether it will always refuse the event (too
large for a JetStream server's max_payload, say), so such an event fails at the producer,
alone, instead of holding its key in the relay. After commit, it publishes excluded events
straight to their routed targets: the design document lets a service exclude events from
outbox processing; they are not stored and get no delivery guarantee, and a failure is
logged, never raised into the service's code path that already committed.

This lives with the targets, not with the outbox: the outbox sits below the targets and
takes these two jobs as plain hooks (``target_check``, ``direct_publisher``), which the
constructor here fills in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine

from tidings.config import TidingsConfig
from tidings.db import make_engine
from tidings.events.outbox import OutboxEvent
from tidings.outbox.incomplete import IncompleteEvents
from tidings.outbox.producer import Outbox
from tidings.routing.table import Routes, current_routes
from tidings.targets.base import Target
from tidings.targets.registry import shared_target

log = logging.getLogger(__name__)

#: How long an emit trusts the routes it last read. The relay reads them per micro-batch; a
#: producer emitting thousands of events a second must not query ``tidings_route`` for each.
ROUTES_TTL_S = 1.0


def outbox_from_config(config: TidingsConfig, engine: Engine | None = None, **hooks: Any) -> Outbox:
    """An outbox on ``config.database`` (or ``engine``) that knows where each event type is
    routed.

    Emit refuses an event a routed target will always refuse (e.g. larger than a JetStream
    server's max_payload), so it fails alone at the producer instead of in the relay;
    excluded events go straight to their routed targets after commit. ``hooks`` are the
    :class:`~tidings.outbox.producer.Outbox` hooks; a ``direct_publisher`` or
    ``target_check`` given there replaces the routed one.
    """
    if engine is None:
        engine = make_engine(config.database.url)
    targets = RoutedTargets(config, engine)
    hooks.setdefault("direct_publisher", targets.publish)
    hooks.setdefault("target_check", targets.refusal)
    return Outbox(engine, config.outbox, **hooks)


def incomplete_events_from_config(
    config: TidingsConfig, engine: Engine | None = None
) -> IncompleteEvents:
    """The incomplete events of ``config.database`` (or ``engine``), each with the targets
    the routes in force owe it (re-read at most every second), as Spring Modulith's
    ``IncompleteEventPublications``: find, resubmit, park, unpark."""
    if engine is None:
        engine = make_engine(config.database.url)
    routed = RoutedTargets(config, engine)
    return IncompleteEvents(engine, lambda event_type: routed.routes().targets_for(event_type))


class RoutedTargets:
    """The targets of each event type, with the routes cached for ``routes_ttl`` seconds."""

    def __init__(
        self, config: TidingsConfig, engine: Engine, *, routes_ttl: float = ROUTES_TTL_S
    ) -> None:
        self.config = config
        self.engine = engine
        self.routes_ttl = routes_ttl
        self._routes: tuple[float, Routes] | None = None  # (read at, routes)
        self._targets: dict[str, Target] = {}
        self._lock = threading.Lock()

    def routes(self) -> Routes:
        """The routes in force, read again once they are older than ``routes_ttl``."""
        cached = self._routes
        now = time.monotonic()
        if cached is None or now - cached[0] >= self.routes_ttl:
            cached = self._routes = (now, current_routes(self.config, self.engine))
        return cached[1]

    def targets_for(self, event_type: str) -> list[Target]:
        """The configured targets ``event_type`` is routed to (unknown names are skipped:
        the relay reports them when it meets the event)."""
        found = []
        for name in self.routes().targets_for(event_type):
            target = self._target(name)
            if target is not None:
                found.append(target)
        return found

    def refusal(self, event: OutboxEvent) -> str | None:
        """Why a target ``event`` is routed to will always refuse it, or None."""
        for target in self.targets_for(event.event_type):
            reason = target.refusal(event)
            if reason is not None:
                return reason
        return None

    def publish(self, events: Sequence[OutboxEvent]) -> None:
        """Publish excluded events once to each of their routed targets; log what failed."""
        routes = self.routes()
        for event in events:
            for name in routes.targets_for(event.event_type):
                target = self._target(name)
                try:
                    error = (
                        f"unknown target {name!r}" if target is None else target.publish([event])[0]
                    )
                except Exception as exc:  # unavailable, a failed call: logged, never raised
                    error = f"{type(exc).__name__}: {exc}"
                if error is not None:
                    log.warning(
                        "excluded event not delivered",
                        extra={"event_id": event.event_id, "target": name, "error": error},
                    )

    def _target(self, name: str) -> Target | None:
        """The process-wide target of that name, looked up once (the lookup dumps its
        configuration to JSON, too slow to repeat on every emit)."""
        target = self._targets.get(name)
        if target is None:
            spec = self.config.targets.get(name)
            if spec is None:
                return None
            with self._lock:
                target = self._targets.setdefault(name, shared_target(name, spec))
        return target
