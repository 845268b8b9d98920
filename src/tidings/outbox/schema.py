"""The event log (outbox) schema, created and upgraded by the library itself.

Tables follow the design document's physical model (``outbox_event``,
``outbox_event_attribute`` and its indexes) extended with the patent's event-log fields
([0060], [0062]), a per-target delivery state, and ``seq``: the monotonically increasing
log sequence the relay reads in order. ``tidings_target_mark`` keeps, per target, when the
newest confirmation recorded there was made (see :mod:`tidings.outbox.confirmations`).

On PostgreSQL ``seq`` comes from :func:`tidings_next_seq`, which forces the transaction to
own a transaction id *before* it draws a sequence value. The relay relies on that to know
when every transaction that could still commit a lower ``seq`` has finished (see
:mod:`tidings.pipeline.source.watermark`).
"""

from __future__ import annotations

import json
from datetime import datetime

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
    String,
    Table,
    Text,
    UniqueConstraint,
    select,
    text,
)

from tidings.errors import SchemaError
from tidings.events.outbox import OutboxEvent
from tidings.events.timeutil import as_utc

SCHEMA_VERSION = 2

metadata = MetaData()

#: The open-row condition, spelled exactly as the partial index spells it so that the
#: planners (SQLite's in particular) match it to the index.
OPEN_ROW = text("status IN ('PENDING', 'HELD', 'FAILED')")

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
    Column("payload", Text, nullable=False),
    Column("headers", Text, nullable=False),
    Column("logged_at", DateTime(timezone=True), nullable=False),
    Column("status", String(16), nullable=False),
    Column("retry_count", Integer, nullable=False, default=0),
    Column("error_details", Text),
    Column("last_publish_at", DateTime(timezone=True)),
    Column("deliveries", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("concurrency_version", Integer, nullable=False, default=1),
    Index("idx_01_outbox_event", "status", "updated_at"),
    Index("idx_02_outbox_event", "correlation_id", "event_type"),
    # Only open rows: the relay's "is an earlier event of this key unpublished?" check reads
    # it, and publishing an event takes it out instead of rewriting an entry.
    Index(
        "idx_03_outbox_event",
        "partition_key",
        "seq",
        sqlite_where=OPEN_ROW,
        postgresql_where=OPEN_ROW,
    ),
    sqlite_autoincrement=True,  # never reuse a seq after housekeeping deleted the newest rows
)

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
    Column("attribute_value", Text),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("event_id", "attribute_key", name="uk_01_outbox_event_attribute"),
)

route = Table(
    "tidings_route",
    metadata,
    Column("event_type", String(256), primary_key=True),
    Column("target", String(256), primary_key=True),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

batch_log = Table(
    "tidings_batch_log",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("job", String(16), nullable=False),
    Column("batch_id", BigInteger, nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False),
    Column("max_seq", BigInteger, nullable=False),
    Column("summary", Text, nullable=False),
    Index("idx_01_tidings_batch_log", "job", "max_seq"),
)

lease = Table(
    "tidings_lease",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("owner", String(128), nullable=False),
    Column("expires_at", Float, nullable=False),  # epoch seconds
)

#: Per target: the newest confirmation the log records there (``deliveries``' ``at``), never
#: lowered. Version 2 of the schema.
target_mark = Table(
    "tidings_target_mark",
    metadata,
    Column("target", String(256), primary_key=True),
    Column("confirmed_at", DateTime(timezone=True), nullable=False),
)

meta = Table(
    "tidings_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
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
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text(_PG_SEQ_FUNCTION))
            conn.execute(
                text("ALTER TABLE outbox_event ALTER COLUMN seq SET DEFAULT tidings_next_seq()")
            )


def _upgrade_to_2(engine: Engine) -> None:
    # A log created at version 1 lacks the marks (a new log got them from version 1's step).
    metadata.create_all(engine, tables=[target_mark])


_UPGRADES = {1: _upgrade_to_1, 2: _upgrade_to_2}


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
    _run_upgrades(engine, version)


def _run_upgrades(engine: Engine, version: int) -> None:
    for target in range(version + 1, SCHEMA_VERSION + 1):
        _UPGRADES[target](engine)
        with engine.begin() as conn:
            conn.execute(meta.delete().where(meta.c.key == "schema_version"))
            conn.execute(meta.insert().values(key="schema_version", value=str(target)))
