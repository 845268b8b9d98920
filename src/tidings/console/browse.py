"""The incomplete events as the console lists them, and one event in full.

The list is :meth:`IncompleteEvents.find <tidings.outbox.incomplete.IncompleteEvents.find>`,
the query ``tidings events list`` runs, paged in log order by ``seq`` (each page starts
after the last ``seq`` of the one before: no OFFSET, so page 1000 costs what page 1 does).
An event's page reads its row by ``event_id`` (the unique index) and its per-target state
as the list does; both are bounded reads whatever the size of the log (design notes:
``docs/design/console.md``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from tidings.config.model import parse_duration
from tidings.errors import UsageError
from tidings.events.outbox import EventStatus
from tidings.events.timeutil import as_utc
from tidings.outbox.incomplete import (
    INCOMPLETE_STATUSES,
    EventFilter,
    IncompleteEvent,
    IncompleteEvents,
    TargetState,
)
from tidings.outbox.schema import outbox_event

#: The longest value a filter field of the list takes.
MAX_FIELD = 256


@dataclass(frozen=True)
class ListQuery:
    """A list's filter as the form gives it (every field a string, empty when unset)."""

    status: str = ""
    event_type: str = ""
    target: str = ""
    key: str = ""
    older_than: str = ""
    after: str = ""

    @classmethod
    def of(cls, params: Any) -> ListQuery:
        """The query of a request's parameters (unknown ones ignored)."""
        values = {}
        for name in ("status", "event_type", "target", "key", "older_than", "after"):
            value = str(params.get(name, "")).strip()
            if len(value) > MAX_FIELD:
                raise UsageError(f"{name}: at most {MAX_FIELD} characters")
            values[name] = value
        return cls(**values)

    def event_filter(self, limit: int, known_targets: set[str]) -> EventFilter:
        """The :class:`EventFilter` of this query; a UsageError names a bad field."""
        statuses = None
        if self.status:
            try:
                statuses = frozenset({EventStatus(self.status.upper())})
            except ValueError:
                names = ", ".join(sorted(INCOMPLETE_STATUSES))
                raise UsageError(f"status: {self.status!r} is not one of {names}") from None
        if self.target and self.target not in known_targets:
            names = ", ".join(sorted(known_targets)) or "none"
            raise UsageError(f"target: {self.target!r} is not a target (targets: {names})")
        age = None
        if self.older_than:
            try:
                age = parse_duration(self.older_than)
            except ValueError as exc:
                raise UsageError(f"older than: {exc}") from None
        after = None
        if self.after:
            if not self.after.isdigit():
                raise UsageError(f"after: {self.after!r} is not a sequence number")
            after = int(self.after)
        return EventFilter(
            statuses=statuses,
            event_type=self.event_type or None,
            target=self.target or None,
            partition_key=self.key or None,
            older_than=age,
            limit=limit,
            after_seq=after,
        )

    def params(self, **changed: str) -> dict[str, str]:
        """This query's non-empty fields, with ``changed`` ones replaced (for links)."""
        values = {**vars(self), **changed}
        return {name: value for name, value in values.items() if value}


@dataclass(frozen=True)
class EventPage:
    """Everything the event page shows about one event."""

    seq: int
    event_id: str
    event_type: str
    version: str
    status: str
    partition_key: str | None
    correlation_id: str | None
    originator: str | None
    logged_at: datetime
    updated_at: datetime
    last_publish_at: datetime | None
    retry_count: int
    error: str | None
    payload: str
    headers: dict[str, Any]
    targets: dict[str, TargetState]
    deliveries: dict[str, Any]


def page_of_events(
    events: IncompleteEvents, query: ListQuery, limit: int, known_targets: set[str]
) -> tuple[list[IncompleteEvent], bool]:
    """One page of the matching events and whether there is another after it."""
    found = events.find(query.event_filter(limit + 1, known_targets))
    return found[:limit], len(found) > limit


def event_page(events: IncompleteEvents, event_id: str) -> EventPage | None:
    """The event ``event_id``, whatever its status; None if the log has no such event."""
    with events.engine.connect() as conn:
        row = conn.execute(select(outbox_event).where(outbox_event.c.event_id == event_id)).first()
    if row is None:
        return None
    found = events.find(EventFilter(event_ids=(event_id,)))
    deliveries = json.loads(row.deliveries) if row.deliveries else {}
    targets = (
        found[0].targets
        if found
        else {
            name: TargetState(state.get("state", "?"), state.get("error"), state.get("failures", 0))
            for name, state in deliveries.items()
        }
    )
    return EventPage(
        seq=row.seq,
        event_id=row.event_id,
        event_type=row.event_type,
        version=row.event_version,
        status=row.status,
        partition_key=row.partition_key,
        correlation_id=row.correlation_id,
        originator=row.originator,
        logged_at=as_utc(row.logged_at),
        updated_at=as_utc(row.updated_at),
        last_publish_at=as_utc(row.last_publish_at) if row.last_publish_at else None,
        retry_count=row.retry_count,
        error=row.error_details,
        payload=_pretty(row.payload),
        headers=json.loads(row.headers) if row.headers else {},
        targets=targets,
        deliveries=deliveries,
    )


def _pretty(payload: str) -> str:
    try:
        return json.dumps(json.loads(payload), indent=2, ensure_ascii=False)
    except ValueError:
        return payload
