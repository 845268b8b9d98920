"""What an append to the event store stores, and under which numbers.

Dedup: an event is recognised by its outbox event id together with its type, so that a
relay re-publishing after a crash does not store it twice, while one outbox event routed to
two targets on the same store with different type prefixes is stored once under each type.
Events of other servers (a Hat syncer's) are recognised by their id as well.

Numbers: the next positions, session and instance numbers are taken from the store's
counters (:mod:`.counters`) in one statement per call.

The functions run inside the append transaction the store holds (:mod:`.driver`); the hot
ones use plain SQL on its :class:`~.driver.DriverCursor`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, select, tuple_

from tidings.events.model import (
    EventId,
    EventType,
    NewEvent,
    PayloadKind,
    StoredEvent,
    encode_type,
)
from tidings.events.validation import check_new_event, check_synced_event, size_problem
from tidings.server.store.counters import (
    POSITION_COUNTER,
    HeldCounters,
    advance_counters,
    instance_counter,
    session_counter,
)
from tidings.server.store.driver import DriverCursor
from tidings.server.store.schema import (
    COPY_EVENT_TYPES,
    COPY_EVENTS_SQL,
    EVENT_COLUMNS,
    INSERT_EVENT_SQL,
    event_row,
    events_from_rows,
    events_table,
)

log = logging.getLogger(__name__)

#: Bound parameters per ``IN`` list; keeps every statement well below driver limits.
_IN_CHUNK = 500

#: The stored value of each payload kind (an enum's ``.value`` is a descriptor call: a
#: dict look-up is a fifth of it, on the loop that builds every row).
_KIND_VALUES: dict[PayloadKind | None, str | None] = {None: None} | {
    kind: kind.value for kind in PayloadKind
}

#: The dedup key of an event: its outbox event id and its type as stored (encode_type).
_OutboxKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Registered:
    """The outcome of one session of :meth:`EventStore.register_sessions`."""

    #: One per input: the event stored now, or the one stored earlier for an outbox duplicate.
    events: list[StoredEvent]
    #: The events this session stored, in order (what subscribers must be told of).
    fresh: list[StoredEvent]


@dataclass(frozen=True, slots=True)
class SessionsPlan:
    """The sessions of one register call split into what to store and what is stored."""

    #: Per session, the events to store now.
    fresh: list[list[NewEvent]]
    #: Per session and input, its already stored event or its index among all events the
    #: call stores.
    slots: list[list[StoredEvent | int]]

    @property
    def count(self) -> int:
        """How many events the call stores."""
        return sum(len(session) for session in self.fresh)

    def outcome(self, stored: list[StoredEvent]) -> list[Registered]:
        """Each session's outcome, given the events stored for :attr:`fresh`, in order."""
        results: list[Registered] = []
        offset = 0
        for session_fresh, session_slots in zip(self.fresh, self.slots, strict=True):
            results.append(
                Registered(
                    [s if isinstance(s, StoredEvent) else stored[s] for s in session_slots],
                    stored[offset : offset + len(session_fresh)],
                )
            )
            offset += len(session_fresh)
        return results


def encode_types(events: Sequence[NewEvent], check: bool = True) -> dict[EventType, str]:
    """Refuse, before touching the database, anything the store could not keep faithfully
    (unless ``check`` is off: the caller checked already).

    Returns the stored text of each distinct type: a batch usually repeats a few types, and
    encoding each once is a large share of a big register's Python time.
    """
    encoded_types: dict[EventType, str] = {}
    for index, new_event in enumerate(events):
        if check:
            check_new_event(f"event {index}: ", new_event)
        if new_event.type not in encoded_types:
            encoded_types[new_event.type] = encode_type(new_event.type)
    return encoded_types


def encode_synced_types(events: Sequence[StoredEvent]) -> dict[EventType, str]:
    """Like :func:`encode_types`, for events that come with their id and timestamp."""
    encoded_types: dict[EventType, str] = {}
    for index, synced in enumerate(events):
        check_synced_event(f"synced event {index}: ", synced)
        if synced.type not in encoded_types:
            encoded_types[synced.type] = encode_type(synced.type)
    return encoded_types


def plan_sessions(
    conn: DriverCursor,
    sessions: Sequence[Sequence[NewEvent]],
    encoded_types: dict[EventType, str],
) -> SessionsPlan:
    """Plan every session of a call first: a duplicate may point at an event of an earlier
    session of the call, and all numbers are then taken in one statement and all rows
    inserted in one executemany (the per-statement cost, not the rows, dominates a group of
    small sessions)."""
    outbox_ids = {
        e.outbox_event_id for events in sessions for e in events if e.outbox_event_id is not None
    }
    known = select_outbox_keys(conn, outbox_ids) if outbox_ids else {}
    first_index: dict[_OutboxKey, int] = {}
    plan = SessionsPlan([], [])
    total = 0
    for events in sessions:
        session_fresh, session_slots = _plan_session(
            events, known, encoded_types, first_index, total
        )
        plan.fresh.append(session_fresh)
        plan.slots.append(session_slots)
        total += len(session_fresh)
    return plan


def _plan_session(
    events: Sequence[NewEvent],
    known: dict[_OutboxKey, StoredEvent],
    encoded_types: dict[EventType, str],
    first_index: dict[_OutboxKey, int],
    offset: int,
) -> tuple[list[NewEvent], list[StoredEvent | int]]:
    """Split a session into the events to store and, per input, its already stored event
    or its index among all events the call stores (``offset`` is where this session's
    start). ``first_index`` carries the keys planned so far in the call, so a repeated
    outbox id and type maps to its first occurrence, in this session or an earlier one."""
    fresh: list[NewEvent] = []
    slots: list[StoredEvent | int] = []
    for new_event in events:
        outbox_id = new_event.outbox_event_id
        if outbox_id is None:
            slots.append(offset + len(fresh))
            fresh.append(new_event)
            continue
        key = (outbox_id, encoded_types[new_event.type])
        if key in known:
            slots.append(known[key])
        elif key in first_index:
            slots.append(first_index[key])
        else:
            first_index[key] = offset + len(fresh)
            slots.append(offset + len(fresh))
            fresh.append(new_event)
    return fresh, slots


def insert_sessions(
    conn: DriverCursor,
    server_id: int,
    sessions: Sequence[Sequence[NewEvent]],
    encoded_types: dict[EventType, str],
    held: HeldCounters | None = None,
    timestamps: Sequence[int | None] | None = None,
) -> list[StoredEvent]:
    """Insert the non-empty ones of ``sessions`` as the next sessions of ``server_id``, in
    one ``executemany``; return the stored events of all of them, in order. ``held``: the
    counters of the open held transaction (``durability: periodic``), else they are
    advanced in the database. ``timestamps``: each session's timestamp (one per session,
    empty ones included), else the time each is stored.

    Rows are built straight from the new events (not from the stored ones) because this
    loop is most of the Python time of a large register.
    """
    session_name, instance_name = session_counter(server_id), instance_counter(server_id)
    count = sum(len(events) for events in sessions)
    session_count = sum(1 for events in sessions if events)
    advance = advance_counters if held is None else held.advance
    last = advance(
        conn, {POSITION_COUNTER: count, session_name: session_count, instance_name: count}
    )
    position = last[POSITION_COUNTER] - count
    session = last[session_name] - session_count
    instance = last[instance_name] - count
    stored: list[StoredEvent] = []
    rows: list[tuple[Any, ...]] = []
    for number, events in enumerate(sessions):
        if not events:
            continue
        session += 1
        timestamp_us = (None if timestamps is None else timestamps[number]) or (
            time.time_ns() // 1000
        )
        for new_event in events:
            position += 1
            instance += 1
            kind = new_event.payload_kind
            stored.append(
                StoredEvent(
                    position,
                    EventId(server_id, session, instance),
                    new_event.type,
                    timestamp_us,
                    new_event.source_timestamp_us,
                    new_event.payload,
                    kind,
                    new_event.outbox_event_id,
                )
            )
            rows.append(
                (
                    position,
                    server_id,
                    session,
                    instance,
                    encoded_types[new_event.type],
                    timestamp_us,
                    new_event.source_timestamp_us,
                    new_event.payload,
                    _KIND_VALUES[kind],
                    new_event.outbox_event_id,
                )
            )
    insert_event_rows(conn, rows)
    return stored


@dataclass(frozen=True, slots=True)
class SyncedPlan:
    """What an append of synced events stores, and the copies it skips."""

    #: The synced events to store, in input order.
    fresh: list[StoredEvent]
    #: Each skipped copy of an outbox event held under another id: ``(copy id, id held)``.
    copies: list[tuple[EventId, EventId]]
    #: The positions of the already stored events among the ids held.
    held: dict[EventId, int]


def plan_synced(
    conn: Connection,
    raw: DriverCursor,
    events: Sequence[StoredEvent],
    encoded_types: dict[EventType, str],
) -> SyncedPlan:
    """The synced events to store: not stored yet, first of their id in the call, not
    colliding on the outbox dedup key with another id (those are the copies, see
    EventStore.append_synced), and, on PostgreSQL, not too long to index. ``raw`` is the
    driver cursor of ``conn``."""
    seen = _select_known_ids(conn, {e.id for e in events})
    known_keys = select_outbox_keys(
        raw, {e.outbox_event_id for e in events if e.outbox_event_id is not None}
    )
    owners = {key: stored.id for key, stored in known_keys.items()}
    plan = SyncedPlan([], [], {stored.id: stored.position for stored in known_keys.values()})
    for synced in events:
        if synced.id in seen:
            continue
        if raw.postgresql and (problem := size_problem(synced.type, synced.outbox_event_id)):
            # PostgreSQL cannot index it (an index entry is at most 2,704 bytes): failing
            # the batch would stop the sync for good, at the same event every time.
            log.error("synced event %s skipped: %s", synced.id, problem)
            continue
        if synced.outbox_event_id is not None:
            key = (synced.outbox_event_id, encoded_types[synced.type])
            owner = owners.get(key)
            if owner is not None:
                log.warning(
                    "synced event %s skipped: outbox event %r of type %s is already stored as %s",
                    synced.id,
                    synced.outbox_event_id,
                    key[1],
                    owner,
                )
                plan.copies.append((synced.id, owner))
                continue
            owners[key] = synced.id
        seen.add(synced.id)
        plan.fresh.append(synced)
    return plan


def insert_synced(
    conn: DriverCursor, events: Sequence[StoredEvent], encoded_types: dict[EventType, str]
) -> list[StoredEvent]:
    """Insert synced ``events`` with their own ids at the next positions; return them so."""
    last_position = advance_counters(conn, {POSITION_COUNTER: len(events)})[POSITION_COUNTER]
    first_position = last_position - len(events) + 1
    stored = [
        replace(synced, position=first_position + offset) for offset, synced in enumerate(events)
    ]
    insert_event_rows(conn, [event_row(e, encoded_types[e.type]) for e in stored])
    return stored


def insert_event_rows(conn: DriverCursor, rows: list[tuple[Any, ...]]) -> None:
    """Insert event rows (:data:`EVENT_COLUMNS` order): one ``executemany`` on SQLite, one
    binary ``COPY`` on PostgreSQL.

    psycopg's ``executemany`` runs one statement per row, and each cost the server ~50 us
    (2.4 s of server time per 50,000 relayed events, measured). One ``INSERT ... SELECT
    FROM unnest`` of a column array each did the batch in one statement; a binary COPY
    does the same without parsing the arrays' text, and fills heap pages many rows at a
    time (fewer WAL records).
    """
    if not rows:
        return
    if conn.postgresql:
        conn.copy_rows(COPY_EVENTS_SQL, COPY_EVENT_TYPES, rows)
    else:
        conn.executemany(INSERT_EVENT_SQL, rows)


def add_types(conn: DriverCursor, encoded_types: set[str]) -> None:
    """Record the types of a batch in ``event_types``, each once.

    ``ON CONFLICT DO NOTHING`` (SQLite and PostgreSQL alike) checks the primary key first and
    writes nothing for a known type, so a batch of known types costs one index probe per
    distinct type and no write.
    """
    if not encoded_types:
        return
    conn.executemany(
        "INSERT INTO event_types (type) VALUES (?) ON CONFLICT (type) DO NOTHING",
        [(encoded,) for encoded in sorted(encoded_types)],
    )


def select_by_outbox_ids(conn: DriverCursor, ids: set[str]) -> Iterator[StoredEvent]:
    """Yield the stored events of ``ids`` in chunked ``IN`` queries, each chunk by position
    (on PostgreSQL one query, the ids as one array parameter: a statement per 500 ids
    cost the server its parse and plan of 500 parameters each time).

    All rows of one id are in one chunk, so they come in position order.
    """
    ordered = sorted(ids)
    if conn.postgresql:
        statement = (
            f"SELECT {', '.join(EVENT_COLUMNS)} FROM event_events "
            "WHERE outbox_event_id = ANY(?::text[]) ORDER BY position"
        )
        yield from events_from_rows(conn.rows(statement, (ordered,)))
        return
    for start in range(0, len(ordered), _IN_CHUNK):
        chunk = ordered[start : start + _IN_CHUNK]
        marks = ", ".join("?" * len(chunk))
        statement = (
            f"SELECT {', '.join(EVENT_COLUMNS)} FROM event_events "
            f"WHERE outbox_event_id IN ({marks}) ORDER BY position"
        )
        yield from events_from_rows(conn.rows(statement, tuple(chunk)))


def select_outbox_keys(conn: DriverCursor, ids: set[str]) -> dict[_OutboxKey, StoredEvent]:
    """Fetch the stored events of ``ids`` by dedup key.

    Keyed by the stored type text: encode_type is canonical, so it equals the encoding of
    a new event of the same type.
    """
    found: dict[_OutboxKey, StoredEvent] = {}
    for stored in select_by_outbox_ids(conn, ids):
        assert stored.outbox_event_id is not None
        found[(stored.outbox_event_id, encode_type(stored.type))] = stored
    return found


def _select_known_ids(conn: Connection, ids: set[EventId]) -> set[EventId]:
    """The ones of ``ids`` already stored, looked up in chunks on the unique id index."""
    c = events_table.c
    ordered = sorted(ids)
    found: set[EventId] = set()
    for start in range(0, len(ordered), _IN_CHUNK):
        chunk = [(i.server, i.session, i.instance) for i in ordered[start : start + _IN_CHUNK]]
        query = select(c.server, c.session, c.instance).where(
            tuple_(c.server, c.session, c.instance).in_(chunk)
        )
        found.update(EventId(*row) for row in conn.execute(query))
    return found
