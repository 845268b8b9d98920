"""The event-store target: the relay's way into the embedded event store.

An outbox event becomes one server event whose type is the configured prefix plus the outbox
type, whose source timestamp is the moment the producer logged it, and which carries the
outbox event id, so a batch published again after a crash is recognised and not stored twice.
The store recognises an event by outbox id and type together, so two targets on one store
with different type prefixes each store their own copy of an outbox event routed to both.
A whole call is one session in one transaction, hence ``atomic``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import Field

from tidings.config import DatabaseUrl, TargetConfig
from tidings.errors import TargetCallFailed, TargetUnavailable
from tidings.events.model import NewEvent, PayloadKind
from tidings.events.outbox import OutboxEvent
from tidings.server.store import EventStore
from tidings.targets.base import Target

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


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


class EventStoreTarget(Target):
    """Publishes to an :class:`EventStore`, opened on first use.

    Opening late means an unreachable database makes publishes fail with an error the relay
    records and retries, instead of stopping the relay from starting.
    """

    atomic = True
    config_model = EventStoreTargetConfig

    def __init__(self, name: str, config: EventStoreTargetConfig) -> None:
        super().__init__(name)
        self._config = config
        self._type_prefix = tuple(config.type_prefix)
        self._store: EventStore | None = None
        self._lock = threading.Lock()

    @property
    def config(self) -> EventStoreTargetConfig:
        """The configuration this target was created with (read-only)."""
        return self._config

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """Register ``events`` as one session: all are confirmed, or the call failed as one.

        A store that cannot be opened is unavailable (nothing was sent); a failing
        registration may be any event's fault, so the relay narrows it down.
        """
        if not events:
            return []
        try:
            store = self._opened_store()
        except Exception as exc:
            raise TargetUnavailable(self._error("cannot open the store", exc)) from exc
        try:
            store.register([to_new_event(e, self._type_prefix) for e in events])
        except Exception as exc:
            raise TargetCallFailed(self._error("failed", exc)) from exc
        return [None] * len(events)

    def _error(self, what: str, exc: Exception) -> str:
        return f"event store target {self.name!r} {what}: {type(exc).__name__}: {exc}"

    def close(self) -> None:
        """Close the store if it was opened."""
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def _opened_store(self) -> EventStore:
        """Return the store, opening it now if no earlier attempt succeeded."""
        with self._lock:
            if self._store is None:
                self._store = EventStore(self._config.url, server_id=self._config.server_id)
            return self._store


def to_new_event(event: OutboxEvent, type_prefix: tuple[str, ...]) -> NewEvent:
    """The server event an outbox event becomes (shared by the local and remote targets)."""
    return NewEvent(
        type=(*type_prefix, event.event_type),
        payload=event.payload.encode(),
        payload_kind=PayloadKind.JSON,
        source_timestamp_us=(event.logged_at - _EPOCH) // _MICROSECOND,
        outbox_event_id=event.event_id,
    )
