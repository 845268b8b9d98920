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
    """An event message for every subscription of it: its JSON written once (``body``,
    without the key) and its ``route`` (subscriber -> its keys the event matches, one mapping
    shared by every event of the type). A busy type with many subscribers must cost the loop
    that serves everyone neither a serialization nor a queued message per subscriber (the
    hostile benchmark's never-reading subscribers stalled the others for seconds so): the
    transport appends it once to the ring its connections read (:mod:`.serving.ring`), and the
    key is added (:func:`keyed`) only when it is sent."""

    body: str
    route: Mapping[Hashable, tuple[str, ...]]


def keyed(body: str, key: str) -> str:
    """The message as sent: ``body`` (a JSON object) with ``"key"`` added (first)."""
    return '{"key": ' + json.dumps(key) + ", " + body[1:]


#: What :meth:`EventViews.step` returns: an event for its route (written already), or a view
#: message for one subscriber.
Outgoing = EventText | tuple[Hashable, dict[str, Any]]


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
