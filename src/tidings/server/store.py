"""The embedded event store: a durable, append-only event log in SQLite or PostgreSQL.

It is the storage of a Hat-compatible event server, so it keeps Hat's event model
(:mod:`tidings.events`, checked by :mod:`tidings.events.validation`): an event id is
``(server, session, instance)`` with 0 reserved for "before the first"; one register call is
one session whose events share the server timestamp; the type is a list of strings.
As in hat-event 0.8.5, ``session`` goes up by one per register call and ``instance`` is one
counter per server over all its sessions (it does not restart in each session). On top of
that every event gets a ``position``, an increasing 64-bit integer over the whole log, which
stream consumers (FTN18) keep as their cursor, and the outbox event id it came from. An event
is recognised by its outbox event id together with its type, so that a relay re-publishing
after a crash does not store it twice, while one outbox event routed to two targets on the
same store with different type prefixes is stored once under each type.

Events of other servers, received by a Hat syncer, are stored with their own ids and
timestamps (:meth:`EventStore.append_synced`); :meth:`EventStore.events_after` serves a
syncer's backlog. A table of the distinct event types lets queries resolve type patterns to
exact types (tidings.server.query).

The same SQLAlchemy Core code runs on both databases. Appends are serialized (SQLite
``BEGIN IMMEDIATE``, PostgreSQL transaction-scoped advisory lock), so positions become
visible in increasing order and a reader following positions never skips one. Positions,
session and instance numbers come from a counter table rather than ``max()`` over the
events, so they are never reused, even after retention has deleted old events.

The names without a leading underscore are the store's public surface, also for the other
modules of the server (queries, engine): the table definitions, row decoding and type
encoding.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Connection,
    Engine,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Select,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    insert,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from tidings.db import driver_url
from tidings.errors import SchemaError, StoreBusy, StoreError
from tidings.events.model import EventId, EventType, NewEvent, PayloadKind, StoredEvent
from tidings.events.validation import (
    check_new_event,
    check_synced_event,
    require_int,
    require_outbox_id,
)

log = logging.getLogger(__name__)

#: Version of the tables below; stored in ``event_store_meta`` so a later release can upgrade.
#: 2 added ``event_types`` and the per-type query indexes (see _upgrade_from_1).
SCHEMA_VERSION = 2

#: Bound parameters per ``IN`` list; keeps every statement well below driver limits.
_IN_CHUNK = 500
#: Key of the PostgreSQL advisory lock that serializes appends ("tidings1" in ASCII).
_PG_APPEND_LOCK_KEY = 0x74696469_6E677331
#: Execution option telling the SQLite ``begin`` hook to take the write lock up front.
_APPEND_OPTION = "tidings_event_store_append"
_POSITION_COUNTER = "position"
_SQLITE_PRAGMAS = (
    "PRAGMA busy_timeout = 30000",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
    # 32 MiB per connection (allocated as used): random outbox ids touch the whole index.
    "PRAGMA cache_size = -32768",
    # Commits leave checkpoints to the store's own thread (_Checkpointer); this one, at
    # ~40 MiB of WAL, is only the backstop if that thread falls behind.
    "PRAGMA wal_autocheckpoint = 10000",
)
#: How often the checkpoint thread copies the WAL into the database (SQLite).
_CHECKPOINT_INTERVAL_S = 0.5


@dataclass(frozen=True, slots=True)
class Registered:
    """The outcome of one session of :meth:`EventStore.register_sessions`."""

    #: One per input: the event stored now, or the one stored earlier for an outbox duplicate.
    events: list[StoredEvent]
    #: The events this session stored, in order (what subscribers must be told of).
    fresh: list[StoredEvent]


_metadata = MetaData()

_meta = Table(
    "event_store_meta",
    _metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)

_counters = Table(
    "event_counters",
    _metadata,
    Column("name", String(64), primary_key=True),
    Column("value", BigInteger, nullable=False),
)

events_table = Table(
    "event_events",
    _metadata,
    # INTEGER (not BIGINT) on SQLite makes it the rowid: the table is clustered by position.
    Column(
        "position",
        BigInteger().with_variant(Integer, "sqlite"),
        primary_key=True,
        autoincrement=False,
    ),
    Column("server", BigInteger, nullable=False),
    Column("session", BigInteger, nullable=False),
    Column("instance", BigInteger, nullable=False),
    # Canonical JSON array, see encode_type. Byte order ("C") on PostgreSQL, as SQLite
    # already has, so that a type prefix is a contiguous index range (tidings.server.query).
    Column("type", Text().with_variant(Text(collation="C"), "postgresql"), nullable=False),
    Column("timestamp_us", BigInteger, nullable=False),
    Column("source_timestamp_us", BigInteger),
    Column("payload", LargeBinary),
    Column("payload_kind", String(8)),
    Column("outbox_event_id", Text),
    CheckConstraint("session > 0 AND instance > 0", name="event_events_id_check"),
    CheckConstraint(
        "payload_kind IN ('binary', 'json', 'sbs')", name="event_events_payload_kind_check"
    ),
    CheckConstraint(
        "(payload IS NULL) = (payload_kind IS NULL)", name="event_events_payload_check"
    ),
    UniqueConstraint("server", "session", "instance", name="event_events_id_key"),
    # Leading with outbox_event_id, it also serves the lookups by outbox id alone.
    UniqueConstraint("outbox_event_id", "type", name="event_events_outbox_key"),
    # The query indexes (tidings.server.query): each ends with the columns of the order it
    # serves, the event id breaking ties, so that ordered, limited queries read no more rows
    # than they return. The two led by type make "the first event of this type in this
    # order" (unique_type) one index probe, even when a whole session shares the type and
    # the timestamp.
    Index("event_events_type_time_idx", "type", "timestamp_us", "server", "session", "instance"),
    Index(
        "event_events_type_source_idx",
        "type",
        "source_timestamp_us",
        "server",
        "session",
        "instance",
    ),
    Index("event_events_timestamp_idx", "timestamp_us", "server", "session", "instance"),
    Index(
        "event_events_source_timestamp_idx",
        "source_timestamp_us",
        "server",
        "session",
        "instance",
    ),
)

#: Every type that has been stored (encode_type text), so that a query can turn its type
#: patterns into a list of exact types (a few thousand rows) instead of matching patterns
#: against millions of events. Only grows: a type whose events retention deleted stays, which
#: costs a query one empty index probe. Same collation as ``event_events.type``, so that a
#: type prefix is a range here too.
event_types_table = Table(
    "event_types",
    _metadata,
    Column(
        "type",
        Text().with_variant(Text(collation="C"), "postgresql"),
        primary_key=True,
    ),
    sqlite_with_rowid=False,
)

#: The v1 index that event_events_type_time_idx replaces (see _upgrade_from_1).
_V1_TYPE_INDEX = "event_events_type_idx"

_PG_APPEND_LOCK = text("SELECT pg_advisory_xact_lock(:key)")


class DriverCursor:
    """A DBAPI cursor for plain SQL written with ``?`` marks (``%s`` for psycopg).

    Registration and queries are the server's hot paths; SQLAlchemy's per-statement work
    cost more than a small register or a small query itself, so they run fixed SQL strings
    on the driver directly. No statement has a ``?`` other than its parameter marks.
    """

    __slots__ = ("cursor", "error", "postgresql")

    def __init__(self, cursor: Any, postgresql: bool, error: type[Exception]) -> None:
        self.cursor = cursor
        self.postgresql = postgresql
        #: The driver's base exception class, for callers that turn it into StoreError.
        self.error = error

    @classmethod
    def of(cls, conn: Connection) -> DriverCursor:
        """The driver cursor of a SQLAlchemy connection, in its current transaction."""
        driver = conn.connection.driver_connection
        assert driver is not None
        return cls(
            driver.cursor(), conn.dialect.name == "postgresql", conn.dialect.loaded_dbapi.Error
        )

    def rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run ``statement``; its rows, if it returns any."""
        self.cursor.execute(self._marked(statement), params)
        return self.cursor.fetchall() if self.cursor.description else []

    def chunks(
        self, statement: str, params: Sequence[Any], size: int
    ) -> Iterator[list[tuple[Any, ...]]]:
        """Run ``statement`` and yield its rows ``size`` at a time as they are read.

        On PostgreSQL through a server-side cursor, since psycopg's ordinary cursor fetches
        the whole result into memory first.
        """
        connection = self.cursor.connection
        cursor = (
            connection.cursor(name="tidings_chunks") if self.postgresql else connection.cursor()
        )
        try:
            cursor.execute(self._marked(statement), params)
            while rows := cursor.fetchmany(size):
                yield rows
        finally:
            cursor.close()

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        self.cursor.executemany(self._marked(statement), rows)

    def _marked(self, statement: str) -> str:
        return statement.replace("?", "%s") if self.postgresql else statement


class _Writer:
    """The connection registrations are written on, kept for the store's whole life.

    Checking a connection out of the pool for every register, with its events, cost more
    than a small register; one kept connection, used under a lock, costs nothing. Appends of
    other stores and processes are still serialized by the database (``BEGIN IMMEDIATE`` on
    SQLite, the advisory lock on PostgreSQL). A connection that fails is dropped and the
    next register opens a new one.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._postgresql = engine.dialect.name == "postgresql"
        self._driver_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        self._lock = threading.Lock()
        self._connection: Any = None

    @contextmanager
    def transaction(self, url: str, wait: bool = True) -> Iterator[DriverCursor]:
        """One append transaction; database errors leave as :class:`StoreError`, and
        :class:`StoreBusy` if ``wait`` is off and another writer holds the append lock."""
        with self._lock:
            try:
                if self._connection is None:
                    self._connection = self._engine.raw_connection()
                driver = self._connection.driver_connection
                raw = DriverCursor(driver.cursor(), self._postgresql, self._driver_error)
                self._lock_appends(raw, url, wait)
                yield raw
                if self._postgresql:
                    driver.commit()
                else:
                    raw.rows("COMMIT")
            except BaseException as exc:
                self._rollback()
                if isinstance(exc, self._driver_error):
                    raise StoreError(
                        f"event store {url}: cannot register: {type(exc).__name__}: {exc}"
                    ) from exc
                raise

    def close(self) -> None:
        with self._lock:
            self._discard()

    def _lock_appends(self, raw: DriverCursor, url: str, wait: bool) -> None:
        """Begin the transaction holding the database-wide append lock."""
        if self._postgresql:
            if wait:
                raw.rows("SELECT pg_advisory_xact_lock(?)", (_PG_APPEND_LOCK_KEY,))
                return
            [(locked,)] = raw.rows("SELECT pg_try_advisory_xact_lock(?)", (_PG_APPEND_LOCK_KEY,))
        elif wait:
            raw.rows("BEGIN IMMEDIATE")
            return
        else:
            raw.rows("PRAGMA busy_timeout = 0")
            try:
                raw.rows("BEGIN IMMEDIATE")
                locked = True
            except self._driver_error as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                locked = False
            finally:
                raw.rows(_SQLITE_PRAGMAS[0])  # the busy timeout again
        if not locked:
            raise StoreBusy(f"event store {url}: another writer holds the append lock")

    def _rollback(self) -> None:
        """Roll back; a connection that cannot even do that is dropped."""
        if self._connection is None:
            return
        try:
            driver = self._connection.driver_connection
            if self._postgresql:
                driver.rollback()
            elif driver.in_transaction:
                driver.execute("ROLLBACK")
        except Exception:
            self._discard()

    def _discard(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.invalidate()
            self._connection = None


class _Checkpointer:
    """Copies SQLite's write-ahead log into the database from a thread of its own.

    SQLite's automatic checkpoint runs inside the commit that crosses its threshold and
    syncs the file there: a small register written on the server's event loop (inline)
    then held every client for the 30-60 ms of that sync. Here a PASSIVE checkpoint, which
    waits for no reader or writer, runs every :data:`_CHECKPOINT_INTERVAL_S` on its own
    connection, so commits stay well below the automatic threshold and never sync.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        connection: Any = None
        try:
            while not self._stop.wait(_CHECKPOINT_INTERVAL_S):
                try:
                    if connection is None:
                        connection = self._engine.raw_connection()
                    connection.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except Exception as exc:
                    # Commits' automatic checkpoint still bounds the WAL meanwhile.
                    log.warning("event store checkpoint failed: %s: %s", type(exc).__name__, exc)
                    if connection is not None:
                        with contextlib.suppress(Exception):
                            connection.invalidate()
                    connection = None
        finally:
            if connection is not None:
                with contextlib.suppress(Exception):
                    connection.close()


class EventStore:
    """The durable event log of one event server (``server_id``), safe to share by threads.

    Several stores, threads or processes may append to one database at once; appends are
    serialized by the database, reads run concurrently with them.
    """

    def __init__(self, url: str, server_id: int = 1) -> None:
        require_int("event store: server_id", server_id, minimum=1)
        self.server_id = server_id
        self._session_name = _session_counter(server_id)
        self._instance_name = _instance_counter(server_id)
        #: Types known to be in event_types (rows there are never deleted), so that a
        #: register of known types writes nothing there.
        self._known_types: set[str] = set()
        parsed = _parse_url(url)
        self.url = parsed.render_as_string(hide_password=True)
        self._engine = _create_engine(parsed)
        self._writer = _Writer(self._engine)
        self._closed = False
        try:
            self._prepare()
        except BaseException:
            self._engine.dispose()
            raise
        self._checkpointer = _Checkpointer(self._engine) if self.backend == "sqlite" else None

    @property
    def backend(self) -> str:
        """The database kind: ``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    def register(self, events: Sequence[NewEvent]) -> list[StoredEvent]:
        """Store ``events`` as one session, all or nothing; return one stored event per input.

        An event whose ``(outbox_event_id, type)`` is already stored (or repeated earlier in
        the same call) is not stored again: its slot holds the event stored first. The same
        outbox id with another type is a different event. A call made only of such duplicates
        uses no session or instance number.
        """
        return self.register_sessions([events])[0].events

    def register_sessions(
        self,
        sessions: Sequence[Sequence[NewEvent]],
        *,
        validated: bool = False,
        wait: bool = True,
    ) -> list[Registered]:
        """Store several sessions in one transaction (group commit), in order, all or nothing.

        Each session gets its own session number and timestamp exactly as if it had been
        registered alone (:meth:`register`); only the commit is shared, which is what makes
        many small registrations fast. Outbox duplicates are recognised across the sessions
        of the call too. ``validated`` says the caller (the engine) has already checked every
        event with :func:`validate_new_event`, so the store does not check them again. With
        ``wait`` off, a call that would have to wait for another writer raises
        :class:`StoreBusy` instead, having stored nothing.
        """
        encoded_types: dict[EventType, str] = {}
        for events in sessions:
            encoded_types.update(_validate(events, check=not validated))
        if not encoded_types:
            return [Registered([], []) for _ in sessions]
        results: list[Registered] = []
        if self._closed:
            raise StoreError(f"event store {self.url}: cannot register: the store is closed")
        with self._writer.transaction(self.url, wait) as conn:
            known = _select_outbox_keys(
                conn,
                {
                    e.outbox_event_id
                    for events in sessions
                    for e in events
                    if e.outbox_event_id is not None
                },
            )
            # Plan every session first (a duplicate may point at an event of an earlier
            # session of the call), then take all numbers in one statement and insert all
            # rows in one executemany: the per-statement cost, not the rows, dominates a group
            # of small sessions.
            first_index: dict[_OutboxKey, int] = {}
            fresh: list[list[NewEvent]] = []
            slots: list[list[StoredEvent | int]] = []
            total = 0
            for events in sessions:
                session_fresh, session_slots = _plan(
                    events, known, encoded_types, first_index, total
                )
                fresh.append(session_fresh)
                slots.append(session_slots)
                total += len(session_fresh)
            stored = self._append(conn, fresh, encoded_types) if total else []
            offset = 0
            for session_fresh, session_slots in zip(fresh, slots, strict=True):
                results.append(
                    Registered(
                        [s if isinstance(s, StoredEvent) else stored[s] for s in session_slots],
                        stored[offset : offset + len(session_fresh)],
                    )
                )
                offset += len(session_fresh)
            new_types = set(encoded_types.values()) - self._known_types
            _add_types(conn, new_types)
        self._known_types |= new_types
        return results

    def append_synced(self, events: Sequence[StoredEvent]) -> list[StoredEvent]:
        """Store events received from peer servers with their own ids and timestamps.

        Ids, timestamps, source timestamps, payloads and outbox ids are kept as given; the
        ``position`` of the inputs is ignored and fresh local positions are assigned in input
        order. All or nothing, under the same append lock as :meth:`register`. Returns the
        newly stored events, in input order, with their positions.

        An id already stored (or repeated earlier in the call) is skipped silently, so a
        syncer may re-send what it is not sure arrived. Events of this store's own server
        (a restored peer sending our events back) are stored too, and the session and
        instance counters of their server are moved past them so that :meth:`register` never
        reuses their ids.

        An event whose ``(outbox_event_id, type)`` is already stored under another id is
        skipped with a warning instead of failing the call: that key is the relay's dedup
        within one store, and the same outbox event legitimately reaches several servers
        (the relay targeting each of them), each storing it under its own id. The database
        holds one row per key, and refusing the batch would stop the sync for good.
        """
        encoded_types = _validate_synced(events)
        if not events:
            return []
        with self._transaction("append synced events", append=True) as conn:
            raw = DriverCursor.of(conn)
            known_ids = _select_known_ids(conn, {e.id for e in events})
            known_keys = _select_outbox_keys(
                raw, {e.outbox_event_id for e in events if e.outbox_event_id is not None}
            )
            fresh = _plan_synced(events, known_ids, known_keys, encoded_types)
            if not fresh:
                return []
            last_position = _advance_counters(raw, {_POSITION_COUNTER: len(fresh)})[
                _POSITION_COUNTER
            ]
            first_position = last_position - len(fresh) + 1
            stored = [
                replace(synced, position=first_position + offset)
                for offset, synced in enumerate(fresh)
            ]
            raw.executemany(_INSERT_SQL, [_row(e, encoded_types[e.type]) for e in stored])
            _add_types(raw, {encoded_types[e.type] for e in stored})
            _raise_id_counters(conn, stored)
        return stored

    def read(self, after_position: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Return up to ``limit`` events with a position greater than ``after_position``."""
        require_int("after_position", after_position, minimum=0)
        require_int("limit", limit, minimum=1)
        query = (
            select(events_table)
            .where(events_table.c.position > after_position)
            .order_by(events_table.c.position)
            .limit(limit)
        )
        with self._transaction("read") as conn:
            return events_from_rows(conn.execute(query))

    def events_after(self, last: EventId, limit: int = 1000) -> list[StoredEvent]:
        """Return up to ``limit`` events of server ``last.server`` with an id after ``last``.

        What a Hat syncer server sends a client that reports ``last`` as its last event id:
        ordered by ``(session, instance)``, ids compared as tuples, other servers' events
        excluded. ``EventId(server, 0, 0)`` asks from the start. Served by the unique index
        on the event id.
        """
        if not isinstance(last, EventId):
            raise StoreError(f"events_after: last must be an EventId, not {last!r}")
        require_int("events_after: last.server", last.server, minimum=1)
        require_int("events_after: last.session", last.session, minimum=0)
        require_int("events_after: last.instance", last.instance, minimum=0)
        require_int("events_after: limit", limit, minimum=1)
        c = events_table.c
        query = (
            select(events_table)
            .where(
                c.server == last.server,
                # The first condition bounds the index range; the second drops the rows of
                # session last.session up to last.instance.
                c.session >= last.session,
                or_(c.session > last.session, c.instance > last.instance),
            )
            .order_by(c.session, c.instance)
            .limit(limit)
        )
        with self._transaction("read events after an event id") as conn:
            return events_from_rows(conn.execute(query))

    def by_outbox_ids(self, ids: Iterable[str]) -> dict[str, list[StoredEvent]]:
        """Return the stored events of ``ids`` by outbox event id; unknown ids are absent.

        One outbox id may have been stored under several types; its list holds all of them,
        in position order.
        """
        if isinstance(ids, str):
            raise StoreError("by_outbox_ids takes an iterable of ids, not one str")
        wanted = set(ids)
        for outbox_id in wanted:
            require_outbox_id(outbox_id)
        with self._transaction("look up outbox ids") as conn:
            found: dict[str, list[StoredEvent]] = {}
            for event in _select_by_outbox_ids(DriverCursor.of(conn), wanted):
                assert event.outbox_event_id is not None
                found.setdefault(event.outbox_event_id, []).append(event)
            return found

    def last_position(self) -> int:
        """The position of the newest stored event (0 when the store is empty)."""
        with self._transaction("read the last position") as conn:
            return conn.execute(
                select(func.coalesce(func.max(events_table.c.position), 0))
            ).scalar_one()

    def count(self) -> int:
        """Return the number of stored events."""
        with self._transaction("count") as conn:
            return conn.execute(select(func.count()).select_from(events_table)).scalar_one()

    def last_event_id(self, server_id: int | None = None) -> EventId:
        """Return the greatest stored id of ``server_id`` (default: this store's server).

        ``EventId(server, 0, 0)`` means no event of that server is stored, as in Hat.
        """
        server = self.server_id if server_id is None else server_id
        require_int("server_id", server, minimum=1)
        query = (
            select(events_table.c.session, events_table.c.instance)
            .where(events_table.c.server == server)
            .order_by(events_table.c.session.desc(), events_table.c.instance.desc())
            .limit(1)
        )
        with self._transaction("read last event id") as conn:
            row = conn.execute(query).first()
        return EventId(server, 0, 0) if row is None else EventId(server, row.session, row.instance)

    @contextmanager
    def snapshot(self, action: str = "read") -> Iterator[Connection]:
        """A transaction for reading whose statements all see the same state of the store.

        For readers that need several statements (tidings.server.query resolves type
        patterns, then reads events): on PostgreSQL it is ``REPEATABLE READ READ ONLY``, as
        ``READ COMMITTED`` would let each statement see newer events; SQLite's transaction
        already reads one snapshot (nothing stops a write there: do not write). Select
        :data:`EVENT_COLUMNS` and decode the rows with :func:`events_from_rows`. ``action``
        names the work in errors, which leave as :class:`StoreError`.
        """
        with self._transaction(action, snapshot=True) as conn:
            yield conn

    def close(self) -> None:
        """Close all database connections; the store is not used afterwards."""
        self._closed = True
        if self._checkpointer is not None:
            self._checkpointer.close()
        self._writer.close()
        self._engine.dispose()

    def _prepare(self) -> None:
        """Create or upgrade the schema and seed this server's counters.

        Done under the append lock so that stores opening one new database at once do not
        race each other's ``CREATE TABLE`` or upgrade.
        """
        with self._transaction("create schema", append=True) as conn:
            _prepare_schema(conn, self.url)
            _seed_counter(
                conn,
                _POSITION_COUNTER,
                select(func.coalesce(func.max(events_table.c.position), 0)),
            )
            of_this_server = events_table.c.server == self.server_id
            _seed_counter(
                conn,
                _session_counter(self.server_id),
                select(func.coalesce(func.max(events_table.c.session), 0)).where(of_this_server),
            )
            _seed_counter(
                conn,
                _instance_counter(self.server_id),
                select(func.coalesce(func.max(events_table.c.instance), 0)).where(of_this_server),
            )

    def _append(
        self,
        conn: DriverCursor,
        sessions: Sequence[Sequence[NewEvent]],
        encoded_types: dict[EventType, str],
    ) -> list[StoredEvent]:
        """Insert the non-empty ones of ``sessions`` as the next sessions, in one
        ``executemany``; return the stored events of all of them, in order.

        Rows are built straight from the new events (not from the stored ones) because this
        loop is most of the Python time of a large register.
        """
        count = sum(len(events) for events in sessions)
        session_count = sum(1 for events in sessions if events)
        last = _advance_counters(
            conn,
            {
                _POSITION_COUNTER: count,
                self._session_name: session_count,
                self._instance_name: count,
            },
        )
        position = last[_POSITION_COUNTER] - count
        session = last[self._session_name] - session_count
        instance = last[self._instance_name] - count
        server_id = self.server_id
        stored: list[StoredEvent] = []
        rows: list[tuple[Any, ...]] = []
        for events in sessions:
            if not events:
                continue
            session += 1
            timestamp_us = time.time_ns() // 1000
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
                        None if kind is None else kind.value,
                        new_event.outbox_event_id,
                    )
                )
        conn.executemany(_INSERT_SQL, rows)
        return stored

    @contextmanager
    def _transaction(
        self, action: str, *, append: bool = False, snapshot: bool = False
    ) -> Iterator[Connection]:
        """Run one transaction; an append one holds the database-wide append lock, a
        snapshot one reads a single state of the database (see :meth:`snapshot`).

        Database failures leave as :class:`StoreError` naming the store and the action.
        """
        if self._closed:
            raise StoreError(f"event store {self.url}: cannot {action}: the store is closed")
        try:
            with self._engine.connect() as conn:
                postgresql = conn.dialect.name == "postgresql"
                if append:
                    conn.execution_options(**{_APPEND_OPTION: True})
                if snapshot and postgresql:
                    conn.execution_options(
                        isolation_level="REPEATABLE READ", postgresql_readonly=True
                    )
                with conn.begin():
                    if append and postgresql:
                        conn.execute(_PG_APPEND_LOCK, {"key": _PG_APPEND_LOCK_KEY})
                    yield conn
        except SQLAlchemyError as exc:
            raise StoreError(f"event store {self.url}: cannot {action}: {_cause(exc)}") from exc


#: The columns of an event row in the order of every plain-SQL statement (insert, select).
EVENT_COLUMNS = (
    "position",
    "server",
    "session",
    "instance",
    "type",
    "timestamp_us",
    "source_timestamp_us",
    "payload",
    "payload_kind",
    "outbox_event_id",
)
_INSERT_COLUMNS = ", ".join(EVENT_COLUMNS)
_KINDS: dict[str | None, PayloadKind | None] = {None: None, **{k.value: k for k in PayloadKind}}


_INSERT_SQL = f"INSERT INTO event_events ({_INSERT_COLUMNS}) VALUES ({', '.join('?' * 10)})"


def _row(event: StoredEvent, encoded_type: str) -> tuple[Any, ...]:
    """The insert parameters of ``event``, in _INSERT_COLUMNS order."""
    kind = event.payload_kind
    return (
        event.position,
        event.id.server,
        event.id.session,
        event.id.instance,
        encoded_type,
        event.timestamp_us,
        event.source_timestamp_us,
        event.payload,
        None if kind is None else kind.value,
        event.outbox_event_id,
    )


def _add_types(conn: DriverCursor, encoded_types: set[str]) -> None:
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


def _parse_url(url: str) -> URL:
    """Parse and check ``url``; a bare ``postgresql://`` gets the psycopg 3 driver."""
    try:
        parsed = driver_url(url)
    except ArgumentError as exc:
        raise StoreError(f"event store: invalid database url {url!r}: {exc}") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise StoreError("event store: an in-memory SQLite database is not durable; give a file")
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(f"event store: unsupported database {backend!r}; use sqlite or postgresql")
    return parsed


def _create_engine(url: URL) -> Engine:
    """Create the engine; on SQLite, install the pragmas and our own ``BEGIN``."""
    if url.get_backend_name() == "postgresql":
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(url)
    event.listen(engine, "connect", _configure_sqlite_connection)
    event.listen(engine, "begin", _begin_sqlite_transaction)
    return engine


def _configure_sqlite_connection(dbapi_connection: Any, _record: Any) -> None:
    """Apply the pragmas and stop pysqlite's implicit BEGIN, which cannot be IMMEDIATE."""
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        for pragma in _SQLITE_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def _begin_sqlite_transaction(conn: Connection) -> None:
    """Begin an append with the write lock held, so appends cannot interleave or deadlock."""
    immediate = conn.get_execution_options().get(_APPEND_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _cause(exc: SQLAlchemyError) -> str:
    """The driver's own error if there is one: shorter than SQLAlchemy's statement dump."""
    cause: BaseException = exc.orig if isinstance(exc, DBAPIError) and exc.orig else exc
    return f"{type(cause).__name__}: {cause}"


def _prepare_schema(conn: Connection, url: str) -> None:
    """Create the tables of a new database, upgrade a version 1 one, refuse any other.

    The version is checked before anything else is created, so that a database of a newer
    tidings is left untouched.
    """
    _meta.create(conn, checkfirst=True)
    stored = conn.scalar(select(_meta.c.value).where(_meta.c.key == "schema_version"))
    if stored == "1":
        _upgrade_from_1(conn, url)
    elif stored is not None and stored != str(SCHEMA_VERSION):
        raise SchemaError(
            f"event store {url}: schema version {stored!r} in the database, "
            f"this tidings supports {SCHEMA_VERSION} (and upgrades 1)"
        )
    _metadata.create_all(conn)
    if stored is None:
        conn.execute(insert(_meta).values(key="schema_version", value=str(SCHEMA_VERSION)))


def _upgrade_from_1(conn: Connection, url: str) -> None:
    """Upgrade a version 1 database in place, in the caller's transaction.

    Adds ``event_types`` filled from the stored events, and replaces the ``(type,
    timestamp_us)`` index by the two per-type indexes of version 2. Instance numbers of
    version 1 restarted in each session; the instance counters are seeded afterwards from
    ``max(instance)``, so new ids still never repeat an old one (their session is new).
    """
    log.info("event store %s: upgrading schema version 1 to %s", url, SCHEMA_VERSION)
    event_types_table.create(conn, checkfirst=True)
    conn.execute(
        insert(event_types_table).from_select(["type"], select(events_table.c.type).distinct())
    )
    conn.exec_driver_sql(f"DROP INDEX IF EXISTS {_V1_TYPE_INDEX}")
    for index in events_table.indexes:
        index.create(conn, checkfirst=True)
    conn.execute(
        update(_meta).where(_meta.c.key == "schema_version").values(value=str(SCHEMA_VERSION))
    )


def _session_counter(server_id: int) -> str:
    return f"session:{server_id}"


def _instance_counter(server_id: int) -> str:
    return f"instance:{server_id}"


def _seed_counter(conn: Connection, name: str, initial: Select[tuple[int]]) -> None:
    """Create counter ``name`` from the scalar query ``initial`` unless it exists."""
    exists = conn.scalar(select(_counters.c.value).where(_counters.c.name == name))
    if exists is None:
        conn.execute(insert(_counters).values(name=name, value=conn.scalar(initial)))


def _raise_id_counters(conn: Connection, stored: Sequence[StoredEvent]) -> None:
    """Move the session and instance counters of the servers of ``stored`` past their ids.

    Only existing counters move: a server without counters in this database has no store
    opened on it yet, and its store seeds them from the stored events when it opens.
    """
    highest: dict[int, tuple[int, int]] = {}
    for synced in stored:
        session, instance = highest.get(synced.id.server, (0, 0))
        highest[synced.id.server] = (
            max(session, synced.id.session),
            max(instance, synced.id.instance),
        )
    for server, (session, instance) in sorted(highest.items()):
        for name, value in (
            (_session_counter(server), session),
            (_instance_counter(server), instance),
        ):
            conn.execute(
                update(_counters)
                .where(_counters.c.name == name, _counters.c.value < value)
                .values(value=value)
            )


def _advance_counters(conn: DriverCursor, increments: dict[str, int]) -> dict[str, int]:
    """Add to several counters in one driver-level statement; return their new values.

    This runs for every session, so it is one round trip of plain SQL rather than one
    SQLAlchemy statement per counter (which cost more than the rest of a small register).
    """
    names = list(increments)
    cases = " ".join(["WHEN ? THEN ?"] * len(names))
    statement = (
        f"UPDATE event_counters SET value = value + CASE name {cases} END "
        f"WHERE name IN ({', '.join('?' * len(names))}) RETURNING name, value"
    )
    params = tuple(x for name in names for x in (name, increments[name])) + tuple(names)
    values = dict(conn.rows(statement, params))
    if len(values) != len(names):
        raise StoreError(f"event store counters missing: {sorted(set(names) - set(values))}")
    return values


#: The dedup key of an event: its outbox event id and its type as stored (encode_type).
_OutboxKey = tuple[str, str]


def _select_by_outbox_ids(conn: DriverCursor, ids: set[str]) -> Iterator[StoredEvent]:
    """Yield the stored events of ``ids`` in chunked ``IN`` queries, each chunk by position.

    All rows of one id are in one chunk, so they come in position order.
    """
    ordered = sorted(ids)
    for start in range(0, len(ordered), _IN_CHUNK):
        chunk = ordered[start : start + _IN_CHUNK]
        marks = ", ".join("?" * len(chunk))
        statement = (
            f"SELECT {_INSERT_COLUMNS} FROM event_events "
            f"WHERE outbox_event_id IN ({marks}) ORDER BY position"
        )
        yield from events_from_rows(conn.rows(statement, tuple(chunk)))


def _select_outbox_keys(conn: DriverCursor, ids: set[str]) -> dict[_OutboxKey, StoredEvent]:
    """Fetch the stored events of ``ids`` by dedup key.

    Keyed by the stored type text: encode_type is canonical, so it equals the encoding of
    a new event of the same type.
    """
    found: dict[_OutboxKey, StoredEvent] = {}
    for stored in _select_by_outbox_ids(conn, ids):
        assert stored.outbox_event_id is not None
        found[(stored.outbox_event_id, encode_type(stored.type))] = stored
    return found


def events_from_rows(rows: Iterable[Sequence[Any]]) -> list[StoredEvent]:
    """The events of plain rows selected as :data:`EVENT_COLUMNS`."""
    events: list[StoredEvent] = []
    for position, server, session, instance, stored_type, ts, source, payload, kind, outbox in rows:
        if payload is not None and type(payload) is not bytes:
            payload = bytes(payload)  # memoryview from some drivers
        events.append(
            StoredEvent(
                position,
                EventId(server, session, instance),
                decode_type(stored_type),
                ts,
                source,
                payload,
                _KINDS[kind],
                outbox,
            )
        )
    return events


def _plan(
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


def _plan_synced(
    events: Sequence[StoredEvent],
    known_ids: set[EventId],
    known_keys: dict[_OutboxKey, StoredEvent],
    encoded_types: dict[EventType, str],
) -> list[StoredEvent]:
    """The synced events to store: not stored yet, first of their id in the call, and not
    colliding on the outbox dedup key with another id (see EventStore.append_synced)."""
    seen = set(known_ids)
    owners = {key: stored.id for key, stored in known_keys.items()}
    fresh: list[StoredEvent] = []
    for synced in events:
        if synced.id in seen:
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
                continue
            owners[key] = synced.id
        seen.add(synced.id)
        fresh.append(synced)
    return fresh


def _validate(events: Sequence[NewEvent], check: bool = True) -> dict[EventType, str]:
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


def _validate_synced(events: Sequence[StoredEvent]) -> dict[EventType, str]:
    """Like _validate, for events that come with their id and timestamp (append_synced)."""
    encoded_types: dict[EventType, str] = {}
    for index, synced in enumerate(events):
        check_synced_event(f"synced event {index}: ", synced)
        if synced.type not in encoded_types:
            encoded_types[synced.type] = encode_type(synced.type)
    return encoded_types


def encode_type(event_type: EventType) -> str:
    """Canonical compact JSON, so equal types give equal, indexable text.

    ASCII-only escaping keeps any string storable, lone surrogates and NUL included; type
    queries must encode their prefixes with this same function.
    """
    return json.dumps(list(event_type), separators=(",", ":"))


@lru_cache(maxsize=65_536)
def decode_type(encoded: str) -> EventType:
    """The type whose stored text (:func:`encode_type`) is ``encoded``.

    Cached: the text of a type never changes, results and type tables repeat few types, and
    decoding is most of the time of turning rows into events or resolving patterns.
    """
    return tuple(json.loads(encoded))
