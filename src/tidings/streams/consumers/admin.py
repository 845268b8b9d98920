"""What an operator asks of the streams from the command line, with the server running or
not: where each stream and each registered consumer stands, and forgetting a consumer.

These read and write the store's database directly (the backend of the server's
configuration), so they work on a stopped server too; a running one sees an unregistered
consumer gone at its next call.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tidings.config.streams import StreamConfig, StreamServerConfig
from tidings.errors import UsageError
from tidings.server.backends import open_backend
from tidings.server.store import EventStore
from tidings.server.store.positions import count_after, read_newest, read_positions
from tidings.streams.consumers.positions import Consumers
from tidings.streams.protocol.interfaces import COMPONENT, LIVE
from tidings.streams.typemap import type_map_from_config


@dataclass(frozen=True)
class ConsumerStatus:
    """A registered consumer: its position and how many of the stream's events it lacks."""

    user: str
    component: str
    position: int
    behind: int
    acked_at: datetime | None


@dataclass(frozen=True)
class StreamStatus:
    """A stream: its newest and oldest retained event ids and its consumers."""

    name: str
    endpoint: str
    first_id: int | None
    last_id: int | None
    retention: bool
    consumers: list[ConsumerStatus]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "endpoint": self.endpoint,
            "first_id": self.first_id,
            "last_id": self.last_id,
            "retention": self.retention,
            "consumers": [
                {
                    "user": c.user,
                    "component": c.component,
                    "position": c.position,
                    "behind": c.behind,
                    "acked_at": None if c.acked_at is None else c.acked_at.isoformat(),
                }
                for c in self.consumers
            ],
        }


def open_store(config: StreamServerConfig) -> EventStore:
    """The store of the server's configuration."""
    return open_backend(
        config.backend.module, config.backend.options(), config.engine.server_id, config.base_dir
    )


def stream_status(store: EventStore, stream: StreamConfig) -> StreamStatus:
    """Where ``stream`` and its consumers stand."""
    consumers = Consumers(store)
    patterns = type_map_from_config(stream.types).all_patterns()
    first = read_positions(store, 0, 1, patterns).events
    newest = read_newest(store, 1, patterns)
    return StreamStatus(
        stream.name,
        stream.endpoint,
        first[0].position if first else None,
        newest[0].position if newest else None,
        stream.retention.enabled,
        [
            ConsumerStatus(
                c.user,
                c.component,
                c.last_id,
                count_after(store, c.last_id, patterns),
                c.acked_at,
            )
            for c in consumers.of_stream(stream.name)
        ],
    )


def unregister(store: EventStore, stream: str, user: str, component: str) -> bool:
    """Forget a consumer, so that it no longer holds the stream's events back."""
    return Consumers(store).unregister(stream, user, component)


def unregister_named(
    config: StreamServerConfig, store: EventStore, stream: str, user: str, component: str
) -> bool:
    """:func:`unregister`, for an operator's names: a name that cannot be a consumer's is a
    UsageError (the operator mistyped something), not answered "no such consumer" as if it
    were only unknown. Any user is taken: a user dropped from ``stream_users`` may still
    have consumers holding events back. False: no such consumer."""
    if stream not in {s.name for s in config.streams}:
        streams = ", ".join(s.name for s in config.streams) or "none"
        raise UsageError(f"no stream {stream!r} in the configuration (defined: {streams})")
    if component == LIVE or not COMPONENT.match(component):
        raise UsageError(
            f"{component!r} is not a consumer component (1-16 of A-Z a-z 0-9 _; LIVE "
            "consumers are never registered)"
        )
    return unregister(store, stream, user, component)
