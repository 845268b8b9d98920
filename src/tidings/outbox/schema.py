"""The event log (outbox) schema, created and upgraded by the library itself.

Tables follow the design document's physical model (``outbox_event``,
``outbox_event_attribute`` and its indexes) extended with the patent's event-log fields
([0060], [0062]), a per-target delivery state, and ``seq``: the monotonically increasing
log sequence the relay reads in order. ``tidings_target_mark`` keeps, per target, when the
newest confirmation recorded there was made (see :mod:`tidings.outbox.confirmations`).
``tidings_stream_producer`` and ``tidings_stream_publish`` hold the ``rabbitmq_stream``
target's producer references and the publishing id each event was sent under (see
:mod:`tidings.outbox.stream_ids`).

On PostgreSQL ``seq`` comes from :func:`tidings_next_seq`, which forces the transaction to
own a transaction id *before* it draws a sequence value. The relay relies on that to know
when every transaction that could still commit a lower ``seq`` has finished (see
:mod:`tidings.pipeline.source.watermark`).

On MySQL/MariaDB ``seq`` is InnoDB's AUTO_INCREMENT, and the producer first takes its
connection's row of ``tidings_writer`` (:mod:`tidings.outbox.writers`), for the same reason.
Every table there is InnoDB with utf8mb4 and a binary collation (keys and types compare as
they do on the other databases: ``"A" != "a"``), text columns are ``LONGTEXT`` (``TEXT`` holds
64 KiB), times ``DATETIME(6)`` (plain ``DATETIME`` drops the microseconds) and the lease's
expiry a ``DOUBLE`` (``FLOAT`` is single precision: epoch seconds to within minutes).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    select,
    text,
)
from sqlalchemy.dialects import mysql

from tidings.db import MYSQL_DIALECTS, is_mysql
from tidings.errors import SchemaError
from tidings.events.outbox import OutboxEvent
from tidings.events.timeutil import as_utc

SCHEMA_VERSION = 6

metadata = MetaData()

#: The column types whose MySQL form differs (see the module docstring).
_TEXT = Text().with_variant(mysql.LONGTEXT(), *MYSQL_DIALECTS)
_TIME = DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *MYSQL_DIALECTS)
_DOUBLE = Float().with_variant(mysql.DOUBLE(asdecimal=False), *MYSQL_DIALECTS)
#: Every table's options on MySQL/MariaDB (ignored elsewhere).
MYSQL_TABLE: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}

#: The open-row condition, spelled exactly as the partial index spells it so that the
#: planners (SQLite's in particular) match it to the index.
OPEN_ROW = text("status IN ('PENDING', 'HELD', 'FAILED')")

#: The rows an operator set aside or no route took, spelled exactly as idx_04's condition
#: spells it, so that the planners match a query's condition to the index.
SET_ASIDE_ROW = text("status IN ('PARKED', 'UNROUTABLE')")
#: Only rows with a correlation id (idx_02's condition).
CORRELATED_ROW = text("correlation_id IS NOT NULL")

#: A key's rows of one status in seq order (schema version 4): a key's PARKED and
#: UNROUTABLE events, which idx_03 does not hold, without reading every parked or
#: unroutable row of the log through the status index. Only those rows are in it (schema
#: version 5 on PostgreSQL, 6 on SQLite), see :data:`PARTIAL_INDEXES`.
KEY_STATUS_INDEX = Index(
    "idx_04_outbox_event",
    "partition_key",
    "status",
    "seq",
    postgresql_where=SET_ASIDE_ROW,
    sqlite_where=SET_ASIDE_ROW,
)
#: The lookups by correlation id (the design document's index). Only rows with one are in
#: it (schema version 5 on PostgreSQL, 6 on SQLite), see :data:`PARTIAL_INDEXES`.
CORRELATION_INDEX = Index(
    "idx_02_outbox_event",
    "correlation_id",
    "event_type",
    postgresql_where=CORRELATED_ROW,
    sqlite_where=CORRELATED_ROW,
)

outbox_event = Table(
    "outbox_event",
    metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("event_id", String(36), nullable=False, unique=True),
    Column("correlation_id", String(64)),
    Column("event_type", String(256), nullable=False),
    Column("event_version", String(32), nullable=False),
    Column("originator", String(256)),
    Column("partition_key", String(256)),
    Column("partition_bucket", Integer, nullable=False),
    Column("payload", _TEXT, nullable=False),
    Column("headers", _TEXT, nullable=False),
    Column("logged_at", _TIME, nullable=False),
    Column("status", String(16), nullable=False),
    Column("retry_count", Integer, nullable=False, default=0),
    Column("error_details", _TEXT),
    Column("last_publish_at", _TIME),
    Column("deliveries", _TEXT),
    Column("created_at", _TIME, nullable=False),
    Column("updated_at", _TIME, nullable=False),
    Column("concurrency_version", Integer, nullable=False, default=1),
    Index("idx_01_outbox_event", "status", "updated_at"),
    CORRELATION_INDEX,
    # Only open rows: the relay's "is an earlier event of this key unpublished?" check reads
    # it, and publishing an event takes it out instead of rewriting an entry.
    Index(
        "idx_03_outbox_event",
        "partition_key",
        "seq",
        sqlite_where=OPEN_ROW,
        postgresql_where=OPEN_ROW,
    ),
    KEY_STATUS_INDEX,
    sqlite_autoincrement=True,  # never reuse a seq after housekeeping deleted the newest rows
    **MYSQL_TABLE,
)

#: The indexes that hold only the rows a query reads them for (PostgreSQL since schema
#: version 5, SQLite since 6; MySQL has no partial indexes). A key's read of one set-aside
#: status (:mod:`tidings.outbox.incomplete`), which spells idx_04's condition as the index
#: does, and a lookup by correlation id both imply the condition, so each finds every row it
#: did. Whole, they cost every relayed event: the relay's PUBLISHED UPDATE changes the
#: status, which moved the row's idx_04 entry on both databases (on SQLite a status UPDATE
#: of 200,000 rows took 28 us a row with it whole and 17 with it partial, measured), and
#: on PostgreSQL, which writes an entry into every index for an UPDATE that changes an
#: indexed column, an idx_02 entry too; every emit wrote an entry into each.
PARTIAL_INDEXES = (CORRELATION_INDEX, KEY_STATUS_INDEX)

#: The ``outbox_event`` columns an :class:`OutboxEvent` is made of, in the order
#: :func:`outbox_event_from_row` takes them.
OUTBOX_EVENT_COLUMNS = (
    "seq",
    "event_id",
    "event_type",
    "event_version",
    "correlation_id",
    "originator",
    "partition_key",
    "payload",
    "headers",
    "logged_at",
)


def outbox_event_from_row(
    seq: int,
    event_id: str,
    event_type: str,
    event_version: str,
    correlation_id: str | None,
    originator: str | None,
    partition_key: str | None,
    payload: str,
    headers: str | None,
    logged_at: datetime,
) -> OutboxEvent:
    """The event of one ``outbox_event`` row, from its :data:`OUTBOX_EVENT_COLUMNS` values
    (a row selected with those columns, or the same values taken column-wise)."""
    return OutboxEvent(
        seq=seq,
        event_id=event_id,
        event_type=event_type,
        payload=payload,
        logged_at=as_utc(logged_at),
        version=event_version,
        correlation_id=correlation_id,
        originator=originator,
        partition_key=partition_key,
        headers=json.loads(headers) if headers and headers != "{}" else {},
    )


outbox_event_attribute = Table(
    "outbox_event_attribute",
    metadata,
    Column("attribute_id", String(36), primary_key=True),
    Column(
        "event_id",
        String(36),
        ForeignKey("outbox_event.event_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("attribute_key", String(256), nullable=False),
    Column("attribute_value", _TEXT),
    Column("updated_at", _TIME, nullable=False),
    UniqueConstraint("event_id", "attribute_key", name="uk_01_outbox_event_attribute"),
    **MYSQL_TABLE,
)

route = Table(
    "tidings_route",
    metadata,
    Column("event_type", String(256), primary_key=True),
    Column("target", String(256), primary_key=True),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("updated_at", _TIME, nullable=False),
    **MYSQL_TABLE,
)

batch_log = Table(
    "tidings_batch_log",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("job", String(16), nullable=False),
    Column("batch_id", BigInteger, nullable=False),
    Column("finished_at", _TIME, nullable=False),
    Column("max_seq", BigInteger, nullable=False),
    Column("summary", _TEXT, nullable=False),
    Index("idx_01_tidings_batch_log", "job", "max_seq"),
    **MYSQL_TABLE,
)

lease = Table(
    "tidings_lease",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("owner", String(128), nullable=False),
    Column("expires_at", _DOUBLE, nullable=False),  # epoch seconds
    **MYSQL_TABLE,
)

#: Per target: the newest confirmation the log records there (``deliveries``' ``at``), never
#: lowered. Version 2 of the schema.
target_mark = Table(
    "tidings_target_mark",
    metadata,
    Column("target", String(256), primary_key=True),
    Column("confirmed_at", _TIME, nullable=False),
    **MYSQL_TABLE,
)

#: The ``rabbitmq_stream`` target's pool of producer references per (target, stream): slot
#: ``n`` is the reference ``<target>.producer-<n>``, leased by one sender at a time
#: (``holder`` NULL: released cleanly; else held until ``expires_at``, epoch seconds).
#: Version 3 of the schema.
stream_producer = Table(
    "tidings_stream_producer",
    metadata,
    Column("target", String(256), nullable=False),
    Column("stream", String(255), nullable=False),
    Column("slot", Integer, nullable=False),
    Column("holder", String(128)),
    Column("expires_at", _DOUBLE, nullable=False),
    PrimaryKeyConstraint("target", "stream", "slot"),
    **MYSQL_TABLE,
)

#: Per (target, event): the stream, producer slot and publishing id the event was sent under,
#: written before the send (:mod:`tidings.outbox.stream_ids`). Version 3 of the schema.
stream_publish = Table(
    "tidings_stream_publish",
    metadata,
    Column("target", String(256), nullable=False),
    Column("event_id", String(36), nullable=False),
    Column("stream", String(255), nullable=False),
    Column("slot", Integer, nullable=False),
    Column("publishing_id", BigInteger, nullable=False),
    PrimaryKeyConstraint("target", "event_id"),
    Index("idx_01_tidings_stream_publish", "target", "stream", "slot", "publishing_id"),
    **MYSQL_TABLE,
)

#: MySQL/MariaDB only: one row per producer connection, locked by each transaction that
#: emits before it draws a ``seq`` (:mod:`tidings.outbox.writers` says why).
writer_metadata = MetaData()
writer = Table(
    "tidings_writer",
    writer_metadata,
    Column("slot", BigInteger, primary_key=True, autoincrement=True),
    Column("claims", BigInteger, nullable=False),  # committed claims (emits) on this slot
    **MYSQL_TABLE,
)

meta = Table(
    "tidings_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
    **MYSQL_TABLE,
)

_PG_SEQ_FUNCTION = """
CREATE OR REPLACE FUNCTION tidings_next_seq() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_current_xact_id();
    RETURN nextval('outbox_event_seq_seq');
END $$
"""


def _upgrade_to_1(engine: Engine) -> None:
    metadata.create_all(engine)
    if is_mysql(engine.dialect.name):
        writer_metadata.create_all(engine)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text(_PG_SEQ_FUNCTION))
            conn.execute(
                text("ALTER TABLE outbox_event ALTER COLUMN seq SET DEFAULT tidings_next_seq()")
            )


def _upgrade_to_2(engine: Engine) -> None:
    # A log created at version 1 lacks the marks (a new log got them from version 1's step).
    metadata.create_all(engine, tables=[target_mark])


def _upgrade_to_3(engine: Engine) -> None:
    # The rabbitmq_stream target's tables (a new log got them from version 1's step).
    metadata.create_all(engine, tables=[stream_producer, stream_publish])


def _upgrade_to_4(engine: Engine) -> None:
    # The (key, status, seq) index (a new log got it from version 1's step).
    KEY_STATUS_INDEX.create(engine, checkfirst=True)


def _upgrade_to_5(engine: Engine) -> None:
    # PostgreSQL: idx_02 and idx_04 made anew with their conditions (PARTIAL_INDEXES);
    # one index build each, in one transaction. Nothing changes elsewhere.
    if engine.dialect.name != "postgresql":
        return
    with engine.begin() as conn:
        for index in PARTIAL_INDEXES:
            partial = conn.execute(
                text("SELECT indpred IS NOT NULL FROM pg_index WHERE indexrelid = to_regclass(:n)"),
                {"n": index.name},
            ).scalar()
            if partial:  # a version 3 log's step 4 built idx_04 as it is now
                continue
            conn.execute(text(f"DROP INDEX IF EXISTS {index.name}"))
            index.create(conn)


def _upgrade_to_6(engine: Engine) -> None:
    # SQLite: the same as version 5 on PostgreSQL; one index build each, in one transaction.
    if engine.dialect.name != "sqlite":
        return
    with engine.begin() as conn:
        # The write lock first (a write that changes nothing takes it): a second process
        # upgrading at once waits here, then finds the indexes built.
        conn.execute(text("DELETE FROM tidings_meta WHERE 0"))
        for index in PARTIAL_INDEXES:
            sql = conn.execute(
                text("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n"),
                {"n": index.name},
            ).scalar()
            if sql is not None and " WHERE " in sql.upper():  # built as it is now (step 4)
                continue
            conn.execute(text(f"DROP INDEX IF EXISTS {index.name}"))
            index.create(conn)


_UPGRADES = {
    1: _upgrade_to_1,
    2: _upgrade_to_2,
    3: _upgrade_to_3,
    4: _upgrade_to_4,
    5: _upgrade_to_5,
    6: _upgrade_to_6,
}


def _stored_version(engine: Engine) -> int:
    with engine.connect() as conn:
        if not engine.dialect.has_table(conn, "tidings_meta"):
            return 0
        value = conn.execute(
            select(meta.c.value).where(meta.c.key == "schema_version")
        ).scalar_one_or_none()
        return int(value) if value is not None else 0


def ensure_schema(engine: Engine) -> None:
    """Create the schema or upgrade it step by step to :data:`SCHEMA_VERSION`."""
    version = _stored_version(engine)
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"database schema version {version} is newer than this tidings "
            f"(knows up to {SCHEMA_VERSION}); upgrade tidings"
        )
    if engine.dialect.name == "postgresql" and version < SCHEMA_VERSION:
        # Two processes upgrading at once must not both run the DDL.
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(7411001)"))
            version = _stored_version(engine)
            _run_upgrades(engine, version)
        return
    if is_mysql(engine.dialect.name) and version < SCHEMA_VERSION:
        # The same on MySQL, whose DDL commits at once: a lock of the session, not of a
        # transaction, held around the whole upgrade.
        with engine.connect() as conn:
            got = conn.execute(text("SELECT GET_LOCK('tidings_schema', 60)")).scalar()
            if got != 1:
                raise SchemaError("timed out waiting for another process upgrading the schema")
            try:
                _run_upgrades(engine, _stored_version(engine))
            finally:
                conn.execute(text("SELECT RELEASE_LOCK('tidings_schema')"))
        return
    _run_upgrades(engine, version)


def _run_upgrades(engine: Engine, version: int) -> None:
    for target in range(version + 1, SCHEMA_VERSION + 1):
        _UPGRADES[target](engine)
        with engine.begin() as conn:
            conn.execute(meta.delete().where(meta.c.key == "schema_version"))
            conn.execute(meta.insert().values(key="schema_version", value=str(target)))
