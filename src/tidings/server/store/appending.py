"""One append transaction, for a writer that decides what to store from what is stored.

The engine offers its modules only the outbox events the store does not hold yet, so that a
re-published event is neither stored nor processed twice. That look-up must see every write
before it (held registrations included) and no other writer may store the same outbox event
between it and the register, so both run in one transaction under the append lock:
:meth:`EventStore.appending <tidings.server.store.facade.EventStore.appending>` opens it, an
:class:`Appending` is its handle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tidings.events.model import EventType, NewEvent
from tidings.events.sources import Source
from tidings.server.store.counters import (
    HeldCounters,
    advance_counters,
    instance_counter,
    session_counter,
)
from tidings.server.store.driver import DriverCursor
from tidings.server.store.planning import (
    Registered,
    add_types,
    encode_types,
    insert_sessions,
    plan_sessions,
    select_by_outbox_ids,
)
from tidings.server.store.sources import insert_sources, source_rows

#: An outbox event as the store knows it: its outbox event id and its type.
OutboxKey = tuple[str, EventType]


class Appending:
    """The open append transaction of one store (``server_id``); used only inside it."""

    def __init__(
        self,
        conn: DriverCursor,
        server_id: int,
        held: HeldCounters | None,
        known_types: set[str],
    ) -> None:
        self._conn = conn
        self._server_id = server_id
        self._held = held
        self._known_types = known_types
        #: The encoded types this transaction added to ``event_types``; the store knows
        #: them once it is committed.
        self.new_types: set[str] = set()

    def stored_outbox_keys(self, events: Iterable[NewEvent]) -> set[OutboxKey]:
        """Which of ``events``' outbox keys (outbox id and type) the store holds already."""
        ids = {e.outbox_event_id for e in events if e.outbox_event_id is not None}
        if not ids:
            return set()
        return {
            (stored.outbox_event_id, stored.type)
            for stored in select_by_outbox_ids(self._conn, ids)
            if stored.outbox_event_id is not None
        }

    def last_numbers(self) -> tuple[int, int]:
        """This server's last session and instance numbers, which the next sessions
        stored in this transaction follow (the engine shows modules the ids their events
        will have, as hat-event does)."""
        names = session_counter(self._server_id), instance_counter(self._server_id)
        advance = advance_counters if self._held is None else self._held.advance
        values = advance(self._conn, dict.fromkeys(names, 0))
        return values[names[0]], values[names[1]]

    def register_sessions(
        self,
        sessions: Sequence[Sequence[NewEvent]],
        *,
        validated: bool = False,
        sources: Sequence[Sequence[Source]] | None = None,
        timestamps: Sequence[int | None] | None = None,
    ) -> list[Registered]:
        """Store ``sessions`` as :meth:`EventStore.register_sessions
        <tidings.server.store.facade.EventStore.register_sessions>` does, in this
        transaction; ``timestamps``, if given, are the sessions' timestamps (the engine
        showed them to modules), else each is the time it is stored."""
        encoded_types: dict[EventType, str] = {}
        for events in sessions:
            encoded_types.update(encode_types(events, check=not validated))
        return self.register_encoded(sessions, encoded_types, sources, timestamps)

    def register_encoded(
        self,
        sessions: Sequence[Sequence[NewEvent]],
        encoded_types: dict[EventType, str],
        sources: Sequence[Sequence[Source]] | None = None,
        timestamps: Sequence[int | None] | None = None,
    ) -> list[Registered]:
        """:meth:`register_sessions` with every type of ``sessions`` encoded already;
        ``sources``, if given, is who registered each event (recorded in ``event_sources``)."""
        if not encoded_types:
            return [Registered([], []) for _ in sessions]
        plan = plan_sessions(self._conn, sessions, encoded_types)
        stored = (
            insert_sessions(
                self._conn, self._server_id, plan.fresh, encoded_types, self._held, timestamps
            )
            if plan.count
            else []
        )
        new_types = set(encoded_types.values()) - self._known_types - self.new_types
        add_types(self._conn, new_types)
        self.new_types |= new_types
        registered = plan.outcome(stored)
        if sources is not None and stored:
            rows = source_rows([r.events for r in registered], sources, stored[0].position)
            insert_sources(self._conn, rows)
        return registered
