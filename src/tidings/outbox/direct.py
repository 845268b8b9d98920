"""Publishing excluded events straight to their targets, after the commit.

The design document lets a service exclude events from outbox processing; they are not
stored and get no delivery guarantee, but they still go where their type is routed. A
failure is logged and counted, never raised into the service's code path that already
committed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy import Engine

from tidings.config import TidingsConfig
from tidings.model import OutboxEvent
from tidings.routing.table import current_routes
from tidings.targets.registry import shared_target

log = logging.getLogger(__name__)


class DirectPublisher:
    """Routes each excluded event like the relay would and publishes it once."""

    def __init__(self, config: TidingsConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine

    def __call__(self, events: Sequence[OutboxEvent]) -> None:
        routes = current_routes(self.config, self.engine)
        for event in events:
            for name in routes.targets_for(event.event_type):
                spec = self.config.targets.get(name)
                error = (
                    f"unknown target {name!r}"
                    if spec is None
                    else shared_target(name, spec).publish([event])[0]
                )
                if error is not None:
                    log.warning(
                        "excluded event not delivered",
                        extra={"event_id": event.event_id, "target": name, "error": error},
                    )
