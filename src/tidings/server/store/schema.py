"""The event store's tables: their definitions, creation and upgrades, and the row format.

Every statement of the store and of its queries (:mod:`.queries`) reads and writes these
tables; the plain-SQL ones list the event columns in :data:`EVENT_COLUMNS` order and turn
rows back into events with :func:`events_from_rows`. A type is stored as its
:func:`encode_type` text, so that equal types are equal text and a type prefix is a range
of it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Connection,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.schema import CreateTable

from tidings.errors import SchemaError
from tidings.events.model import EventId, EventType, PayloadKind, StoredEvent

log = logging.getLogger(__name__)

#: Version of the tables below; stored in ``event_store_meta`` so a later release can upgrade.
#: 2 added ``event_types`` and the per-type query indexes (see _upgrade_from_1); 3 made the
#: outbox key a partial index (see _upgrade_from_2).
SCHEMA_VERSION = 3

_metadata = MetaData()

_meta = Table(
    "event_store_meta",
    _metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)

#: Named counters (positions, and session and instance numbers per server) that only grow,
#: so that numbers are never reused, even after retention has deleted old events.
counters_table = Table(
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
    # already has, so that a type prefix is a contiguous index range (see queries.py).
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
    # Leading with outbox_event_id, it also serves the lookups by outbox id alone. Only the
    # events that have an outbox id are in it (a NULL id never conflicts anyway): the others
    # would each add an entry placed by their type, another page written at every commit.
    Index(
        "event_events_outbox_key",
        "outbox_event_id",
        "type",
        unique=True,
        sqlite_where=text("outbox_event_id IS NOT NULL"),
        postgresql_where=text("outbox_event_id IS NOT NULL"),
    ),
    # The query indexes (see queries.py): each ends with the columns of the order it
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

#: The greatest event id of each server this store has received (a peer's Syncer sent it),
#: whether it is still stored or not: retention may delete all of a peer's events, and the
#: Syncer resumes after this id rather than ask the peer for its history again (see
#: :func:`~tidings.server.store.counters.raise_server_marks`). Only grows.
server_marks_table = Table(
    "event_server_marks",
    _metadata,
    Column("server", BigInteger, primary_key=True, autoincrement=False),
    Column("session", BigInteger, nullable=False),
    Column("instance", BigInteger, nullable=False),
)

#: The peers' copies of events this store holds under another id. An outbox event that
#: reached two servers of a group from the relay (sent again to the second after the first
#: was lost) is stored by each under its own id; when the Syncer then brings one server's
#: copy to the other, that store skips it (it holds the outbox id and type already, see
#: :meth:`~tidings.server.store.facade.EventStore.append_synced`) and records here that the
#: copy's id ``(server, session, instance)`` names the event held at ``position``. Stream
#: consumers, whose positions travel between servers as event ids, count either id
#: (:mod:`.copies`). A row goes when its event is deleted. An added table, not a new schema
#: version: an older tidings reading the store ignores it.
synced_copies_table = Table(
    "event_synced_copies",
    _metadata,
    Column("server", BigInteger, primary_key=True, autoincrement=False),
    Column("session", BigInteger, primary_key=True, autoincrement=False),
    Column("instance", BigInteger, primary_key=True, autoincrement=False),
    Column("position", BigInteger, nullable=False),
    Index("event_synced_copies_position_idx", "position"),
)

#: Who registered the events (:class:`~tidings.events.sources.Source`), for operators: one row
#: per run of a session's events that share a source, keyed by the id of the run's first
#: event, so that a session from one client is one row and the events a module added are
#: another. An event's source is the row of its server and session with the greatest
#: ``instance`` not above its own (:mod:`.sources`). Events that came from a peer's Syncer
#: have their source on their origin server, none here. An added table, not a new schema
#: version: an older tidings reading the store ignores it (and stores no sources).
event_sources_table = Table(
    "event_sources",
    _metadata,
    Column("server", BigInteger, primary_key=True, autoincrement=False),
    Column("session", BigInteger, primary_key=True, autoincrement=False),
    Column("instance", BigInteger, primary_key=True, autoincrement=False),
    Column("kind", String(16), nullable=False),
    Column("source_id", BigInteger, nullable=False),
    Column("name", Text),
)

#: The v1 index that event_events_type_time_idx replaces (see _upgrade_from_1).
_V1_TYPE_INDEX = "event_events_type_idx"

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
#: The insert of one event row, parameters in :data:`EVENT_COLUMNS` order.
INSERT_EVENT_SQL = (
    f"INSERT INTO event_events ({', '.join(EVENT_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(EVENT_COLUMNS))})"
)
#: The same for many rows on PostgreSQL: a binary COPY of the rows (see
#: :func:`~tidings.server.store.planning.insert_event_rows`), each value of the type in
#: :data:`COPY_EVENT_TYPES`.
COPY_EVENTS_SQL = f"COPY event_events ({', '.join(EVENT_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
#: The PostgreSQL type each of :data:`EVENT_COLUMNS` is sent as in :data:`COPY_EVENTS_SQL`.
COPY_EVENT_TYPES = ("int8", "int8", "int8", "int8", "text", "int8", "int8", "bytea", "text", "text")
_KINDS: dict[str | None, PayloadKind | None] = {None: None, **{k.value: k for k in PayloadKind}}


def prepare_schema(conn: Connection, url: str) -> None:
    """Create the tables of a new database, upgrade a version 1 or 2 one, refuse any other.

    The version is checked before anything else is created, so that a database of a newer
    tidings is left untouched.
    """
    _meta.create(conn, checkfirst=True)
    stored = conn.scalar(select(_meta.c.value).where(_meta.c.key == "schema_version"))
    if stored is not None and stored not in _UPGRADES and stored != str(SCHEMA_VERSION):
        raise SchemaError(
            f"event store {url}: schema version {stored!r} in the database, "
            f"this tidings supports {SCHEMA_VERSION} (and upgrades {', '.join(_UPGRADES)})"
        )
    if stored in _UPGRADES:
        log.info("event store %s: upgrading schema version %s to %s", url, stored, SCHEMA_VERSION)
        for step in list(_UPGRADES.values())[list(_UPGRADES).index(stored) :]:
            step(conn, url)
        conn.execute(
            update(_meta).where(_meta.c.key == "schema_version").values(value=str(SCHEMA_VERSION))
        )
    new_marks = not inspect(conn).has_table(server_marks_table.name)
    _metadata.create_all(conn)
    if new_marks:
        _fill_server_marks(conn)
    if stored is None:
        conn.execute(insert(_meta).values(key="schema_version", value=str(SCHEMA_VERSION)))


def _fill_server_marks(conn: Connection) -> None:
    """Start ``event_server_marks`` of a store made before it with each server's greatest
    stored id, so that an existing store needs no migration (an added table, not a new
    schema version: an older tidings reading the store just ignores it)."""
    conn.exec_driver_sql(
        "INSERT INTO event_server_marks (server, session, instance) "
        "SELECT e.server, e.session, MAX(e.instance) FROM event_events e JOIN "
        "(SELECT server, MAX(session) AS session FROM event_events GROUP BY server) m "
        "ON e.server = m.server AND e.session = m.session GROUP BY e.server, e.session"
    )


def _upgrade_from_1(conn: Connection, url: str) -> None:
    """Version 1 to 2, in the caller's transaction.

    Adds ``event_types`` filled from the stored events, and replaces the ``(type,
    timestamp_us)`` index by the two per-type indexes of version 2. Instance numbers of
    version 1 restarted in each session; the instance counters are seeded afterwards from
    ``max(instance)``, so new ids still never repeat an old one (their session is new).
    """
    event_types_table.create(conn, checkfirst=True)
    conn.execute(
        insert(event_types_table).from_select(["type"], select(events_table.c.type).distinct())
    )
    conn.exec_driver_sql(f"DROP INDEX IF EXISTS {_V1_TYPE_INDEX}")
    for index in events_table.indexes:
        if index.name in _V2_TYPE_INDEXES:
            index.create(conn, checkfirst=True)


def _upgrade_from_2(conn: Connection, url: str) -> None:
    """Version 2 to 3, in the caller's transaction: the outbox key becomes a partial index.

    PostgreSQL drops the constraint and indexes the rows with an outbox id. SQLite cannot
    drop a table's UNIQUE constraint: the table is rebuilt by SQLite's own procedure for it
    (a new table made under another name, the rows copied in position order, the old table
    dropped, the new one renamed to its name and indexed), which takes about as long as
    writing the rows once; the store logs how many it copies. Renaming the old table out of
    the way instead would make SQLite rewrite the user's views, triggers and foreign keys
    that refer to ``event_events`` to its new name, then drop them with it; this way they
    keep referring to ``event_events``, the user's own indexes and triggers on it are made
    again, and the caller's transaction has foreign keys unenforced (see
    :func:`.driver.transaction`), so no row of a table referring to it is deleted.
    """
    outbox_key = _index("event_events_outbox_key")
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"ALTER TABLE event_events DROP CONSTRAINT {outbox_key.name}")
        outbox_key.create(conn)
        return
    rows = conn.scalar(select(func.count()).select_from(events_table))
    log.info(
        "event store %s: rebuilding event_events (%d rows) without its outbox constraint", url, rows
    )
    broken_before = len(conn.exec_driver_sql("PRAGMA foreign_key_check").all())
    ours = {index.name for index in events_table.indexes}
    theirs = [
        sql
        for name, sql in conn.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE tbl_name = 'event_events' "
            "AND type IN ('index', 'trigger') AND sql IS NOT NULL ORDER BY rowid"
        )
        if name not in ours
    ]
    conn.execute(CreateTable(events_table.to_metadata(MetaData(), name=_V3_EVENTS)))
    columns = ", ".join(EVENT_COLUMNS)
    conn.exec_driver_sql(
        f"INSERT INTO {_V3_EVENTS} ({columns}) SELECT {columns} FROM event_events ORDER BY position"
    )
    conn.exec_driver_sql("DROP TABLE event_events")
    conn.exec_driver_sql("PRAGMA legacy_alter_table = ON")  # rename only the table itself
    try:
        conn.exec_driver_sql(f"ALTER TABLE {_V3_EVENTS} RENAME TO event_events")
    finally:
        conn.exec_driver_sql("PRAGMA legacy_alter_table = OFF")
    for index in events_table.indexes:
        index.create(conn)
    for sql in theirs:
        conn.exec_driver_sql(sql)
    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
    if len(broken) > broken_before:  # a safety net: the rows were copied as they were
        raise SchemaError(
            f"event store {url}: the upgrade would leave {len(broken) - broken_before} "
            f"row(s) of the user's tables referring to missing events; nothing was changed"
        )


def _index(name: str) -> Index:
    return next(index for index in events_table.indexes if index.name == name)


#: The upgrade from each older version, in order: a version's upgrade runs all from its own.
_UPGRADES = {"1": _upgrade_from_1, "2": _upgrade_from_2}
#: The per-type query indexes version 2 added.
_V2_TYPE_INDEXES = ("event_events_type_time_idx", "event_events_type_source_idx")
#: The name of the version 3 events table while SQLite's upgrade copies the rows into it.
_V3_EVENTS = "event_events_v3"


def event_row(event: StoredEvent, encoded_type: str) -> tuple[Any, ...]:
    """The insert parameters of ``event``, in :data:`EVENT_COLUMNS` order."""
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


@lru_cache(maxsize=65_536)
def decode_type(encoded: str) -> EventType:
    """The type whose stored text (:func:`encode_type`) is ``encoded``.

    Cached: the text of a type never changes, results and type tables repeat few types, and
    decoding is most of the time of turning rows into events or resolving patterns.
    """
    return tuple(json.loads(encoded))
