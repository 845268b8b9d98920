"""The interface every target implements.

A target is a place the relay publishes to: the embedded event store, a JetStream stream,
any other real broker. It is deliberately small so that adding one is one module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from tidings.model import OutboxEvent


class Target(ABC):
    """Publishes outbox events somewhere and says, per event, whether it was confirmed.

    ``atomic`` targets confirm or refuse a whole call at once (one database transaction);
    the relay may then hand them several events of the same partition key in one call,
    in log order. Other targets are never given two events of the same key in one call,
    so that a failure cannot let a later event of that key overtake an earlier one.
    Targets must deduplicate by ``event_id`` where they can: a batch interrupted by a crash
    is published again.
    """

    atomic: bool = False

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """Publish ``events``; return one entry per event: ``None`` if confirmed, else the error."""

    def close(self) -> None:  # noqa: B027 - optional hook, most targets hold nothing
        """Release connections; the target is not used afterwards."""
