"""The event-store target: the relay's way into the embedded event store.

An outbox event becomes one server event whose type is the configured prefix plus the outbox
type, whose source timestamp is the moment the producer logged it, and which carries the
outbox event id, so a batch published again after a crash is recognised and not stored twice.
The store recognises an event by outbox id and type together, so two targets on one store
with different type prefixes each store their own copy of an outbox event routed to both.

Every event that enters a server's store goes through an engine, so the target runs the
engine's session path itself: a whole call is one session of a
:class:`~tidings.server.engine.Engine` over the store, run through the modules configured on
the target (``modules``, as a server file's ``engine.modules``), the events they add stored
with it in one transaction, hence ``atomic``. An event published again is neither stored
nor processed again. The engine's own STARTED/STOPPED events are not registered: the target
is no server. A server on the same store tells its subscribers and Syncer peers of these
sessions through its change feed (:mod:`tidings.server.change_feed`). Modules run in the
relay's workers, one engine per worker process: a module that keeps state in memory sees
only the sessions of its own process (use the ``event_server`` target for such a module).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import Field, field_validator

from tidings.config import DatabaseUrl, TargetConfig
from tidings.config.server import ModuleConfig
from tidings.errors import EngineError, ModuleLoadError, TargetCallFailed, TargetUnavailable
from tidings.events.model import NewEvent, PayloadKind
from tidings.events.outbox import OutboxEvent
from tidings.events.sources import RELAY_SOURCE
from tidings.events.validation import RESERVED_CONSUMER_TYPE, reserved_type_problem
from tidings.server.engine import Engine
from tidings.server.modules import load_modules
from tidings.server.store import EventStore
from tidings.targets.base import Target

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
#: Types a target remembers it takes (:meth:`EventStoreTarget.publish`), at most.
_TYPES_KEPT = 4096


class EventStoreTargetConfig(TargetConfig):
    """The embedded event store: a durable append-only log in SQLite or PostgreSQL."""

    kind: Literal["event_store"] = Field(description="The target's kind: ``event_store``.")
    # The default is resolved too, beside the configuration file (as every default path is).
    url: DatabaseUrl = Field(
        default="sqlite:///tidings-events.db",
        validate_default=True,
        description=(
            "The store's database: ``sqlite:///FILE`` (relative to this file) or "
            "``postgresql://...``."
        ),
    )
    type_prefix: list[str] = Field(
        default_factory=list,
        description="Segments put before the event type: the stored type is ``[*prefix, type]``.",
    )
    server_id: int = Field(
        default=1, gt=0, description="The Hat server id the store's events are registered under."
    )

    _prefix = field_validator("type_prefix")(lambda cls, v: unreserved_prefix(v))
    modules: list[ModuleConfig] = Field(
        default_factory=list,
        description=(
            "Engine modules run in every session of this target, in this order, as a server "
            "file's ``engine.modules``. They run in the relay's workers: a module that keeps "
            "state in memory sees only its own worker's sessions."
        ),
    )


class EventStoreTarget(Target):
    """Publishes through an :class:`Engine` over an :class:`EventStore`, opened on first use.

    Opening late means an unreachable database, or a module that cannot be loaded, makes
    publishes fail with an error the relay records and retries (no event is charged),
    instead of stopping the relay from starting.
    """

    atomic = True
    config_model = EventStoreTargetConfig

    def __init__(self, name: str, config: EventStoreTargetConfig) -> None:
        super().__init__(name)
        self._config = config
        self._type_prefix = tuple(config.type_prefix)
        #: Outbox type -> its stored type, for the types this target takes (checked once:
        #: a relay publishes few types, and the refusal and the tuple were per event).
        self._stored_types: dict[str, tuple[str, ...]] = {}
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    @property
    def config(self) -> EventStoreTargetConfig:
        """The configuration this target was created with (read-only)."""
        return self._config

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """Register ``events`` as one session: all are confirmed, or the call failed as one.

        A store that cannot be opened, or a module that cannot be loaded, is unavailable
        (nothing was sent); a failing session (an event the store refuses, a module that
        fails) may be any event's fault, so the relay narrows it down.
        """
        if not events:
            return []
        # The relay asks refusal first; a caller that did not fails here, storing nothing.
        new_events = [stored_as(e, self._stored_type(e)) for e in events]
        try:
            engine = self._opened_engine()
        except (ModuleLoadError, EngineError) as exc:  # a module's create or subscription
            raise TargetUnavailable(self._error("cannot load its modules", exc)) from exc
        except Exception as exc:
            raise TargetUnavailable(self._error("cannot open the store", exc)) from exc
        try:
            engine.register(
                new_events,
                strict=True,
                source=RELAY_SOURCE,
            )
        except Exception as exc:
            raise TargetCallFailed(self._error("failed", exc)) from exc
        return [None] * len(events)

    def _stored_type(self, event: OutboxEvent) -> tuple[str, ...]:
        """The type ``event`` is stored under; TargetCallFailed if the target refuses it."""
        kept = self._stored_types
        stored = kept.get(event.event_type)
        if stored is None:
            if (problem := self.refusal(event)) is not None:
                raise TargetCallFailed(problem)
            if len(kept) >= _TYPES_KEPT:
                kept.clear()
            stored = kept[event.event_type] = (*self._type_prefix, event.event_type)
        return stored

    def refusal(self, event: OutboxEvent) -> str | None:
        """The event's type would fall under the servers' reserved consumer prefix (an
        outbox type completing the configured prefix to it)."""
        problem = reserved_type_problem((*self._type_prefix, event.event_type))
        return None if problem is None else f"event store target {self.name!r}: {problem}"

    def _error(self, what: str, exc: Exception) -> str:
        return f"event store target {self.name!r} {what}: {type(exc).__name__}: {exc}"

    def close(self) -> None:
        """Close the store if it was opened."""
        with self._lock:
            if self._engine is not None:
                try:
                    self._engine.close()
                finally:
                    self._engine.store.close()
                    self._engine = None

    def _opened_engine(self) -> Engine:
        """Return the engine, opening the store and loading the modules now if no earlier
        attempt succeeded."""
        with self._lock:
            if self._engine is None:
                store = EventStore(self._config.url, server_id=self._config.server_id)
                try:
                    engine = Engine(store, [])
                    load_modules(engine, [module.as_dict() for module in self._config.modules])
                except BaseException:
                    store.close()
                    raise
                self._engine = engine
            return self._engine


def unreserved_prefix(type_prefix: list[str], name: str = "type_prefix") -> list[str]:
    """``type_prefix``, unless every event it makes is under the servers' reserved consumer
    prefix (ValueError, naming the option ``name``): the servers alone write those."""
    if reserved_type_problem((*type_prefix, "")) is not None:
        raise ValueError(
            f"{name} {type_prefix!r} makes types under the reserved prefix "
            f"{'/'.join(RESERVED_CONSUMER_TYPE)}, which only the event servers write"
        )
    return type_prefix


def to_new_event(event: OutboxEvent, type_prefix: tuple[str, ...]) -> NewEvent:
    """The server event an outbox event becomes (shared by the local and remote targets)."""
    return stored_as(event, (*type_prefix, event.event_type))


def stored_as(event: OutboxEvent, stored_type: tuple[str, ...]) -> NewEvent:
    """The server event an outbox event becomes, of ``stored_type`` (the prefixed type, made
    once per type by a caller that publishes many)."""
    return NewEvent(
        stored_type,
        event.payload.encode(),
        PayloadKind.JSON,
        (event.logged_at - _EPOCH) // _MICROSECOND,
        event.event_id,
    )
