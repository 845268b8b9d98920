"""Registered (reliable) consumers and their acknowledged positions, kept in the store's
database beside the log.

A consumer is ``(stream, user, component)``: FTN18 identifies a consumer by the caller's user
and a component name, and a user sees only its own components. Its position is the id of
the last event it acknowledged; an acknowledgement never moves it back, so a late or
repeated one (a retried poll, a push reply arriving after a newer poll) cannot make events
be delivered again out of order. Retention reads the lowest position of a stream's
consumers: nothing above it may leave the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    MetaData,
    String,
    Table,
    and_,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import ColumnElement

from tidings.db import driver_stamp
from tidings.errors import StoreError, StreamError
from tidings.events.timeutil import as_utc, utcnow
from tidings.server.store import DriverCursor, EventStore
from tidings.streams.protocol.ftn3 import NOT_REGISTERED

_metadata = MetaData()

consumers_table = Table(
    "stream_consumers",
    _metadata,
    Column("stream", String(64), primary_key=True),
    Column("user_name", String(64), primary_key=True),
    Column("component", String(16), primary_key=True),
    Column("last_id", BigInteger, nullable=False, default=0),
    Column("registered_at", DateTime(timezone=True), nullable=False),
    Column("acked_at", DateTime(timezone=True)),
)


@dataclass(frozen=True, slots=True)
class Consumer:
    """One registered consumer as stored."""

    stream: str
    user: str
    component: str
    last_id: int
    registered_at: datetime
    acked_at: datetime | None


class Consumers:
    """The registered consumers of every stream of one store. Blocking: call from a thread."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        with store.transaction("create the stream consumers table") as conn:
            _metadata.create_all(conn, checkfirst=True)

    def register(self, stream: str, user: str, component: str) -> bool:
        """Register a consumer (again: no change); True if it is new."""
        c = consumers_table.c
        try:
            with self._store.transaction("register a stream consumer") as conn:
                conn.execute(
                    insert(consumers_table).values(
                        stream=stream,
                        user_name=user,
                        component=component,
                        last_id=0,
                        registered_at=utcnow(),
                    )
                )
            return True
        except StoreError as exc:
            if not isinstance(exc.__cause__, IntegrityError):
                raise
            with self._store.transaction("read a stream consumer") as conn:
                found = conn.execute(select(c.last_id).where(_key(stream, user, component))).first()
            if found is None:
                raise
            return False

    def position(self, stream: str, user: str, component: str) -> int:
        """The consumer's acknowledged position; NotRegistered if there is no such consumer."""
        with self._store.transaction("read a stream consumer") as conn:
            found = conn.execute(
                select(consumers_table.c.last_id).where(_key(stream, user, component))
            ).first()
        if found is None:
            raise _not_registered(stream, component)
        return int(found[0])

    def acknowledge(self, stream: str, user: str, component: str, last_id: int) -> int:
        """Move the consumer's position up to ``last_id`` (never back); the position now.

        One plain statement (polls and push replies come many a second). NotRegistered if
        there is no such consumer.
        """
        with self._store.transaction("acknowledge stream events") as conn:
            now = driver_stamp(conn.dialect.name)(utcnow())
            found = DriverCursor.of(conn).rows(
                f"UPDATE {consumers_table.name} SET "
                "acked_at = CASE WHEN last_id < ? THEN ? ELSE acked_at END, "
                "last_id = CASE WHEN last_id < ? THEN ? ELSE last_id END "
                "WHERE stream = ? AND user_name = ? AND component = ? RETURNING last_id",
                (last_id, now, last_id, last_id, stream, user, component),
            )
        if not found:
            raise _not_registered(stream, component)
        return int(found[0][0])

    def unregister(self, stream: str, user: str, component: str) -> bool:
        """Forget a consumer (its position no longer holds events back); True if it existed."""
        with self._store.transaction("unregister a stream consumer") as conn:
            done = conn.execute(delete(consumers_table).where(_key(stream, user, component)))
        return done.rowcount > 0

    def of_stream(self, stream: str) -> list[Consumer]:
        """The stream's consumers, by user and component."""
        c = consumers_table.c
        with self._store.transaction("list stream consumers") as conn:
            rows = conn.execute(
                select(consumers_table).where(c.stream == stream).order_by(c.user_name, c.component)
            ).all()
        return [
            Consumer(
                r.stream,
                r.user_name,
                r.component,
                int(r.last_id),
                as_utc(r.registered_at),
                None if r.acked_at is None else as_utc(r.acked_at),
            )
            for r in rows
        ]

    def lowest_position(self, stream: str) -> int | None:
        """The lowest position of the stream's consumers; None if it has none."""
        with self._store.transaction("read the lowest consumer position") as conn:
            return conn.execute(
                select(func.min(consumers_table.c.last_id)).where(
                    consumers_table.c.stream == stream
                )
            ).scalar_one_or_none()


def _key(stream: str, user: str, component: str) -> ColumnElement[bool]:
    c = consumers_table.c
    return and_(c.stream == stream, c.user_name == user, c.component == component)


def _not_registered(stream: str, component: str) -> StreamError:
    return StreamError(
        NOT_REGISTERED, f"component {component} is not a registered consumer of stream {stream}"
    )
