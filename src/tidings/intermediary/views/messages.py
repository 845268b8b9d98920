"""What an intermediary's event and SQL-view subscriptions exchange with the parts around
them: the batches the event server upstream hands over (:class:`ChainBatch`, through a
:class:`ChainUpstream`: :class:`.event_server_upstream.TidingsChain`), and the event
messages they hand the transport (:func:`event_message`, written once per event and shared
by every subscription of it as an :class:`EventText`). :mod:`.eventviews` does the rest.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidings.events import PayloadKind, QueryType, StoredEvent


@dataclass(frozen=True)
class EventText:
    """An event message for one subscription, its JSON written once for every subscription
    of the event (``body``, shared, without the key): a busy type with many subscribers must
    not cost one serialization of the same event per subscriber on the loop that serves
    everyone (the hostile benchmark's never-reading subscribers stalled the others for tens
    of seconds so)."""

    key: str
    body: str

    def text(self) -> str:
        """The message as sent: ``body`` with ``"key"`` added (first)."""
        return '{"key": ' + json.dumps(self.key) + ", " + self.body[1:]

    @property
    def size(self) -> int:
        """The length of :meth:`text` in bytes (its JSON is ASCII), without making it: exact
        for a key that JSON writes as it is (no quote, backslash or non-ASCII character),
        a few bytes short otherwise; counted per message sent, so it is cheap."""
        return len(self.body) + len(self.key) + 11


#: What :meth:`EventViews.step` returns: who gets which JSON message (an event's written
#: already).
Outgoing = tuple[Hashable, dict[str, Any] | EventText]


@dataclass(frozen=True)
class ChainBatch:
    """What upstream received in one go: ``events`` for event subscribers (one
    notification, in the server's order) and, per table, the row events to fold (an initial
    load, or the table's new row events of that notification)."""

    events: tuple[StoredEvent, ...] = ()
    rows: Mapping[str, tuple[StoredEvent, ...]] = field(default_factory=dict)


class ChainUpstream(Protocol):
    """The event server as an :class:`EventViews` sees it
    (:class:`.event_server_upstream.TidingsChain`)."""

    async def update(self, patterns: Sequence[QueryType], tables: Mapping[str, QueryType]) -> None:
        """Subscribe to exactly ``patterns``, fold the row events of exactly ``tables`` (table
        -> its row type), loading a new table's rows; returns once the server has taken the
        subscription and new tables' loads are under way, or at once while the server is
        unreachable (the change is then made when it is back)."""
        ...

    async def loaded(self, tables: Iterable[str]) -> None:
        """Returns once the loads of ``tables`` under way are done (their rows handed over
        by :meth:`take` from then on), at once for tables not being loaded."""
        ...

    def take(self) -> list[ChainBatch]:
        """The batches received since the last call, oldest first."""
        ...


def event_message(event: StoredEvent) -> dict[str, Any]:
    """An event as a subscriber gets it (without its subscription key)."""
    message: dict[str, Any] = {
        "op": "event",
        "id": [event.id.server, event.id.session, event.id.instance],
        "type": list(event.type),
        "timestamp": event.timestamp_us,
        "source_timestamp": event.source_timestamp_us,
    }
    if event.payload_kind is PayloadKind.JSON and event.payload is not None:
        message["payload"] = json.loads(event.payload)
    elif event.payload is not None:
        message["payload_kind"] = str(event.payload_kind)
        message["payload_base64"] = base64.b64encode(event.payload).decode()
    return message
