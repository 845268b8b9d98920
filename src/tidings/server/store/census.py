"""What a range of the log holds, type by type: how many events, and the latest of each.

An import (:mod:`tidings.server.hat_import`) checks its work with it: the events it brought
in are those of each source server up to the last id it read, and their count per type and
latest event per type must equal the source's. The latest is by timestamp, then event id,
the order of Hat's latest-value queries (and of :mod:`.retention`'s "latest per type").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tidings.errors import StoreError
from tidings.events.model import EventId, EventType
from tidings.server.store.driver import DriverCursor
from tidings.server.store.facade import EventStore
from tidings.server.store.schema import decode_type, events_table


def _bounded(up_to: Mapping[int, EventId]) -> tuple[str, list[Any]]:
    """A condition selecting each server's events up to its id in ``up_to``."""
    parts, params = [], []
    for server, last in sorted(up_to.items()):
        parts.append("(server = ? AND (session < ? OR (session = ? AND instance <= ?)))")
        params += [server, last.session, last.session, last.instance]
    return " OR ".join(parts) or "1 = 0", params


def census(
    store: EventStore, up_to: Mapping[int, EventId]
) -> tuple[dict[EventType, int], dict[EventType, EventId]]:
    """The count and the latest event's id of every type among the events of each server
    of ``up_to`` up to its id, read from one snapshot."""
    condition, params = _bounded(up_to)
    table = events_table.name
    with store.snapshot("count the events per type") as conn:
        sql = DriverCursor.of(conn)
        try:
            counts = sql.rows(
                f"SELECT type, COUNT(*) FROM {table} WHERE {condition} GROUP BY type", params
            )
            latest: dict[EventType, EventId] = {}
            for text, _ in counts:
                found = sql.rows(
                    f"SELECT server, session, instance FROM {table} WHERE type = ? AND "
                    f"({condition}) ORDER BY timestamp_us DESC, server DESC, session DESC, "
                    "instance DESC LIMIT 1",
                    [text, *params],
                )
                latest[decode_type(text)] = EventId(*found[0])
        except sql.error as exc:
            raise StoreError(f"event store {store.url}: cannot count events: {exc}") from exc
    return {decode_type(text): n for text, n in counts}, latest
