"""An engine module for tests: it answers every event it is offered with a witness event.

Loaded by path (``{module: tests.support.witness_module, subscription: [[t, "*"]]}``) by an
engine anywhere: in the test's process, in the relay's Spark workers (the ``event_store``
target's engine) or in a ``tidings server`` subprocess, whose log the test can only read. So
what the module saw is written where every test can read it: for each event offered, it adds
``[witness, *type]`` to the same session, whose JSON payload names the event's outbox id and
the session's engine-local number. A witness's type is outside any subscription that does
not start with ``witness``, so the module never answers its own events.
"""

from __future__ import annotations

from typing import Any

from tidings.events.matching import QueryType
from tidings.events.model import NewEvent, json_event
from tidings.server.engine import Engine, SessionEvent

WITNESS = "witness"


class Witness:
    """Adds ``[witness, *type]`` for every event offered (``subscription``: what it is)."""

    name = "witness"

    def __init__(self, subscription: tuple[QueryType, ...]) -> None:
        self.subscription = subscription

    def on_session_start(self, session_id: int) -> None:
        """Nothing to prepare: each event is answered alone."""

    def process(self, session_id: int, event: SessionEvent) -> list[NewEvent]:
        witness = {"of": event.outbox_event_id, "session": session_id}
        return [json_event((WITNESS, *event.type), witness)]

    def on_session_stop(self, session_id: int) -> None:
        """Nothing to finish."""


def witness_config(*subscription: list[str]) -> dict[str, Any]:
    """An ``engine.modules`` (or a target's ``modules``) entry loading this module."""
    return {"module": __name__, "subscription": list(subscription)}


def create(config: dict[str, Any], engine: Engine) -> Witness:
    """The module, as an engine loads it: ``subscription`` is a list of query types."""
    return Witness(tuple(tuple(query) for query in config["subscription"]))
