"""Registered (reliable) consumers and their acknowledged positions, kept in the store's
database beside the log.

A consumer is ``(stream, user, component)``: FTN18 identifies a consumer by the caller's user
and a component name, and a user sees only its own components. Its position is the id of
the last event it acknowledged; an acknowledgement never moves it back, so a late or
repeated one (a retried poll, a push reply arriving after a newer poll) cannot make events
be delivered again out of order. Retention reads the lowest position of a stream's
consumers: nothing above it may leave the store.

Beside the local position each consumer keeps its *covers* (:mod:`.replication`): the
position in terms the other servers of a redundant group understand. An acknowledgement
grows them with the events it passes, and :meth:`Consumers.apply` takes a peer's covers,
moving the local position over what they cover.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    MetaData,
    String,
    Table,
    and_,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import ColumnElement

from tidings.errors import StoreError, StreamError
from tidings.events.model import EventType
from tidings.events.timeutil import as_utc, utcnow
from tidings.server.store import EventStore
from tidings.streams.consumers.replication import (
    NAME_LENGTHS,
    Covers,
    covered_prefix,
    ids_between,
    merged,
)
from tidings.streams.protocol.ftn3 import NOT_REGISTERED

_metadata = MetaData()


def _consumer_key() -> list[Column[str]]:
    """The key of a consumer's rows, (stream, user, component): new columns for each table,
    as a column belongs to one table."""
    return [
        Column("stream", String(NAME_LENGTHS["stream"]), primary_key=True),
        Column("user_name", String(NAME_LENGTHS["user"]), primary_key=True),
        Column("component", String(NAME_LENGTHS["component"]), primary_key=True),
    ]


consumers_table = Table(
    "stream_consumers",
    _metadata,
    *_consumer_key(),
    Column("last_id", BigInteger, nullable=False, default=0),
    Column("registered_at", DateTime(timezone=True), nullable=False),
    Column("acked_at", DateTime(timezone=True)),
)

#: Each consumer's covers: per origin server, the newest of its events the consumer passed.
covers_table = Table(
    "stream_consumer_covers",
    _metadata,
    *_consumer_key(),
    Column("server", BigInteger, primary_key=True, autoincrement=False),
    Column("session", BigInteger, nullable=False),
    Column("instance", BigInteger, nullable=False),
)

#: How far this store's log has been read for the group's consumer events.
sync_table = Table(
    "stream_consumer_sync",
    _metadata,
    Column("name", String(16), primary_key=True),
    Column("position", BigInteger, nullable=False),
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

    def __init__(
        self, store: EventStore, carried: Mapping[str, Callable[[EventType], bool]] | None = None
    ) -> None:
        self._store = store
        #: Per stream served here: whether it carries a type (a peer's covers move a
        #: consumer of it over the types it does not carry, :meth:`apply`).
        self._carried = dict(carried or {})
        with store.transaction("create the stream consumers table") as conn:
            _metadata.create_all(conn, checkfirst=True)

    def register(self, stream: str, user: str, component: str) -> bool:
        """Register a consumer (again: no change); True if it is new."""
        c = consumers_table.c
        try:
            with self._store.transaction("register a stream consumer") as conn:
                _insert_consumer(conn, stream, user, component)
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

    def acknowledge(
        self, stream: str, user: str, component: str, last_id: int
    ) -> tuple[int, Covers | None]:
        """Move the consumer's position up to ``last_id`` (never back): the position now,
        and the consumer's covers if they grew (what the group must be told), else None.
        NotRegistered if there is no such consumer."""
        with self._store.transaction("acknowledge stream events") as conn:
            current = _locked_position(conn, stream, user, component)
            if current is None:
                raise _not_registered(stream, component)
            if last_id <= current:
                return current, None
            old = _covers(conn, stream, user, component)
            covers = merged(old, ids_between(conn, current, last_id))
            _write_covers(conn, stream, user, component, old, covers)
            conn.execute(
                update(consumers_table)
                .where(_key(stream, user, component))
                .values(last_id=last_id, acked_at=utcnow())
            )
        return last_id, (covers if covers != old else None)

    def apply(self, stream: str, user: str, component: str, covers: Covers) -> int:
        """Take a peer's word for a consumer: registered, and past what ``covers`` cover.
        Registers it if it is new here, grows its covers and moves its position over the
        events they cover and those its stream does not carry
        (:func:`.replication.covered_prefix`); the position now."""
        with self._store.transaction("apply a peer's stream consumer") as conn:
            current = _locked_position(conn, stream, user, component)
            if current is None:
                current = 0
                _insert_consumer(conn, stream, user, component)
            old = _covers(conn, stream, user, component)
            grown = merged(old, covers)
            _write_covers(conn, stream, user, component, old, grown)
            position = covered_prefix(conn, current, grown, self._carried.get(stream))
            if position > current:
                conn.execute(
                    update(consumers_table)
                    .where(_key(stream, user, component))
                    .values(last_id=position, acked_at=utcnow())
                )
        return position

    def covers(self, stream: str, user: str, component: str) -> Covers:
        """The consumer's covers (empty for one that has passed nothing, or is unknown)."""
        with self._store.transaction("read a stream consumer's covers") as conn:
            return _covers(conn, stream, user, component)

    def synced(self) -> int:
        """The position up to which the log's consumer events have been applied."""
        with self._store.transaction("read the consumer sync position") as conn:
            found = conn.execute(
                select(sync_table.c.position).where(sync_table.c.name == "applied")
            ).scalar_one_or_none()
        return 0 if found is None else int(found)

    def set_synced(self, position: int) -> None:
        """Record that the consumer events up to ``position`` have been applied."""
        c = sync_table.c
        with self._store.transaction("record the consumer sync position") as conn:
            done = conn.execute(
                update(sync_table).where(c.name == "applied").values(position=position)
            )
            if done.rowcount == 0:
                conn.execute(insert(sync_table).values(name="applied", position=position))

    def unregister(self, stream: str, user: str, component: str) -> bool:
        """Forget a consumer (its position no longer holds events back); True if it existed."""
        with self._store.transaction("unregister a stream consumer") as conn:
            done = conn.execute(delete(consumers_table).where(_key(stream, user, component)))
            conn.execute(delete(covers_table).where(_covers_key(stream, user, component)))
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

    def registered(self) -> set[tuple[str, str, str]]:
        """Every registered consumer of every stream, as ``(stream, user, component)``."""
        c = consumers_table.c
        with self._store.transaction("list the stream consumers") as conn:
            rows = conn.execute(select(c.stream, c.user_name, c.component)).all()
        return {(str(stream), str(user), str(component)) for stream, user, component in rows}

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


def _covers_key(stream: str, user: str, component: str) -> ColumnElement[bool]:
    c = covers_table.c
    return and_(c.stream == stream, c.user_name == user, c.component == component)


def _insert_consumer(conn: Connection, stream: str, user: str, component: str) -> None:
    """A new consumer's row: registered now, at position 0 (before the stream's first event)."""
    conn.execute(
        insert(consumers_table).values(
            stream=stream, user_name=user, component=component, last_id=0, registered_at=utcnow()
        )
    )


def _locked_position(conn: Connection, stream: str, user: str, component: str) -> int | None:
    """The consumer's position, its row locked to the end of the transaction (PostgreSQL;
    SQLite's write transaction holds the whole database); None if there is no consumer."""
    found = conn.execute(
        select(consumers_table.c.last_id).where(_key(stream, user, component)).with_for_update()
    ).first()
    return None if found is None else int(found[0])


def _covers(conn: Connection, stream: str, user: str, component: str) -> Covers:
    c = covers_table.c
    rows = conn.execute(
        select(c.server, c.session, c.instance).where(_covers_key(stream, user, component))
    ).all()
    return {int(server): (int(session), int(instance)) for server, session, instance in rows}


def _write_covers(
    conn: Connection, stream: str, user: str, component: str, old: Covers, new: Covers
) -> None:
    """Store the servers' entries of ``new`` that differ from ``old``."""
    c = covers_table.c
    for server, (session, instance) in new.items():
        if old.get(server) == (session, instance):
            continue
        if server in old:
            conn.execute(
                update(covers_table)
                .where(_covers_key(stream, user, component), c.server == server)
                .values(session=session, instance=instance)
            )
        else:
            conn.execute(
                insert(covers_table).values(
                    stream=stream,
                    user_name=user,
                    component=component,
                    server=server,
                    session=session,
                    instance=instance,
                )
            )


def _not_registered(stream: str, component: str) -> StreamError:
    return StreamError(
        NOT_REGISTERED, f"component {component} is not a registered consumer of stream {stream}"
    )
