"""The store's counters: positions, and per server session and instance numbers.

They come from the counter table rather than ``max()`` over the events, so they are never
reused, even after retention has deleted old events. As in hat-event 0.8.5, ``session``
goes up by one per register call and ``instance`` is one counter per server over all its
sessions. A store seeds its own server's counters from the stored events when it opens,
synced events move their servers' counters past their ids, and while a held transaction
(``durability: periodic``) is open the counters live in memory (:class:`HeldCounters`).
Beside them, each server's mark (:func:`raise_server_marks`) keeps the greatest id received
from it, where the Syncer resumes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

from sqlalchemy import Connection, func, insert, select, update

from tidings.errors import StoreError
from tidings.events.model import EventId, StoredEvent
from tidings.server.store.driver import DriverCursor
from tidings.server.store.schema import counters_table, events_table, server_marks_table

#: The name of the position counter (one for the whole log).
POSITION_COUNTER = "position"


@lru_cache(maxsize=256)
def session_counter(server_id: int) -> str:
    return f"session:{server_id}"


@lru_cache(maxsize=256)
def instance_counter(server_id: int) -> str:
    return f"instance:{server_id}"


def seed_counters(conn: Connection, server_id: int) -> None:
    """Create the position counter and ``server_id``'s session and instance counters, each
    from the stored events, unless they exist."""
    c = events_table.c
    of_this_server = c.server == server_id
    for name, initial in (
        (POSITION_COUNTER, select(func.coalesce(func.max(c.position), 0))),
        (
            session_counter(server_id),
            select(func.coalesce(func.max(c.session), 0)).where(of_this_server),
        ),
        (
            instance_counter(server_id),
            select(func.coalesce(func.max(c.instance), 0)).where(of_this_server),
        ),
    ):
        exists = conn.scalar(select(counters_table.c.value).where(counters_table.c.name == name))
        if exists is None:
            conn.execute(insert(counters_table).values(name=name, value=conn.scalar(initial)))


def raise_id_counters(conn: Connection, stored: Sequence[StoredEvent]) -> None:
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
            (session_counter(server), session),
            (instance_counter(server), instance),
        ):
            conn.execute(
                update(counters_table)
                .where(counters_table.c.name == name, counters_table.c.value < value)
                .values(value=value)
            )


def raise_server_marks(conn: DriverCursor, received: Sequence[StoredEvent]) -> None:
    """Move each server's mark up to the greatest id of ``received`` (what its Syncer sent,
    whether stored now or skipped as already there), never down.

    :meth:`~.facade.EventStore.last_event_id` answers from it when retention has deleted
    the events since: otherwise it would fall back to an older id, the Syncer would ask the
    peer for everything after it, and the events would be stored and delivered again.
    """
    greatest: dict[int, tuple[int, int]] = {}
    for event in received:
        server, pair = event.id.server, (event.id.session, event.id.instance)
        greatest[server] = max(greatest.get(server, pair), pair)
    _raise_marks(conn, [EventId(server, *pair) for server, pair in sorted(greatest.items())])


def _raise_marks(conn: DriverCursor, ids: Sequence[EventId]) -> None:
    """Move the marks of the servers of ``ids`` up to them, never down."""
    conn.executemany(
        f"INSERT INTO {server_marks_table.name} (server, session, instance) VALUES (?, ?, ?) "
        "ON CONFLICT (server) DO UPDATE SET session = excluded.session, "
        "instance = excluded.instance WHERE (event_server_marks.session, "
        "event_server_marks.instance) < (excluded.session, excluded.instance)",
        [(i.server, i.session, i.instance) for i in ids],
    )


def continue_after(conn: DriverCursor, last_ids: Sequence[EventId]) -> None:
    """Move each server's session and instance counters and its mark past ``last_ids``
    (creating the counters a server has not got yet), never back.

    For events brought in from elsewhere (hat-event's lmdb, :mod:`tidings.server.hat_import`)
    whose server went further than the events kept: hat's lmdb records each server's last
    registered id even when its conditions or limits kept none of those events, and a server
    continuing here must not number a session it already used.
    """
    for last in last_ids:
        for name, value in (
            (session_counter(last.server), last.session),
            (instance_counter(last.server), last.instance),
        ):
            conn.rows(
                f"INSERT INTO {counters_table.name} (name, value) VALUES (?, ?) "
                f"ON CONFLICT (name) DO UPDATE SET value = excluded.value "
                f"WHERE {counters_table.name}.value < excluded.value",
                [name, value],
            )
    _raise_marks(conn, last_ids)


def last_event_id(conn: Connection, server: int) -> EventId:
    """The greater of ``server``'s mark and its greatest stored id (its own registered
    events move no mark); ``EventId(server, 0, 0)`` when there is neither."""
    c, m = events_table.c, server_marks_table.c
    stored = conn.execute(
        select(c.session, c.instance)
        .where(c.server == server)
        .order_by(c.session.desc(), c.instance.desc())
        .limit(1)
    ).first()
    mark = conn.execute(select(m.session, m.instance).where(m.server == server)).first()
    session, instance = max(tuple(row) for row in (stored, mark, (0, 0)) if row is not None)
    return EventId(server, session, instance)


class HeldCounters:
    """The counters while a held transaction (``durability: periodic``) is open: read at
    its first write, advanced in memory, written back just before its commit; the store's
    :class:`~.driver.HeldState`, told of the transaction's turns under the writer's lock.

    The held transaction holds the database's append lock from its first write to its
    commit, so nobody else moves the counters meanwhile; advancing them in the database
    was one UPDATE ... RETURNING per register, a fifth of a held register's store time.
    Written back in the same transaction as the events, they stay exactly as durable.
    ``on_rolled_back`` is called when the held transaction is rolled back (the store then
    forgets what else it cached of it); ``on_opened`` when one begins and ``on_committed``
    with the last position it stored (None if it stored none) when one is committed, by
    whichever thread wrote or committed it, under the writer's lock.
    """

    __slots__ = (
        "_before_write",
        "_committing",
        "_on_committed",
        "_on_opened",
        "_on_rolled_back",
        "_values",
    )

    def __init__(
        self,
        on_rolled_back: Callable[[], None],
        on_opened: Callable[[], None],
        on_committed: Callable[[int | None], None],
    ) -> None:
        #: The counters' values in the open held transaction (None: not read in it yet).
        self._values: dict[str, int] | None = None
        #: Their values when the current write began (None: not read before it).
        self._before_write: dict[str, int] | None = None
        #: The last position of the transaction being committed.
        self._committing: int | None = None
        self._on_rolled_back = on_rolled_back
        self._on_opened = on_opened
        self._on_committed = on_committed

    def opened(self) -> None:
        self._on_opened()

    def advance(self, conn: DriverCursor, increments: dict[str, int]) -> dict[str, int]:
        """Add to counters; return their new values (as :func:`advance_counters`)."""
        if self._values is None:
            self._values = {}
        missing = [name for name in increments if name not in self._values]
        if missing:
            marks = ", ".join("?" * len(missing))
            statement = f"SELECT name, value FROM event_counters WHERE name IN ({marks})"
            self._values.update(conn.rows(statement, missing))
            if any(name not in self._values for name in missing):
                raise StoreError(f"event store counters missing: {sorted(missing)}")
        for name, step in increments.items():
            self._values[name] += step
        return {name: self._values[name] for name in increments}

    def write_started(self) -> None:
        """A write begins: remember the values, to go back to if it is undone."""
        self._before_write = None if self._values is None else dict(self._values)

    def write_undone(self) -> None:
        """The write was undone to its savepoint: the values from before it."""
        self._values = self._before_write

    def before_commit(self, conn: DriverCursor) -> None:
        """Store the values in the held transaction, about to be committed; the next held
        transaction reads them again (others may write between the two)."""
        values, self._values = self._values, None
        self._committing = values.get(POSITION_COUNTER) if values else None
        if values:
            conn.executemany(
                "UPDATE event_counters SET value = ? WHERE name = ?",
                [(value, name) for name, value in sorted(values.items())],
            )

    def committed(self) -> None:
        self._on_committed(self._committing)

    def rolled_back(self) -> None:
        """The held transaction was rolled back: what was read or advanced in it is gone."""
        self._values = None
        self._on_rolled_back()


def advance_counters(conn: DriverCursor, increments: dict[str, int]) -> dict[str, int]:
    """Add to several counters in one driver-level statement; return their new values.

    This runs for every session, so it is one round trip of plain SQL rather than one
    SQLAlchemy statement per counter (which cost more than the rest of a small register).
    """
    names = list(increments)
    params = tuple(x for name in names for x in (name, increments[name])) + tuple(names)
    values = dict(conn.rows(_advance_statement(len(names)), params))
    if len(values) != len(names):
        raise StoreError(f"event store counters missing: {sorted(set(names) - set(values))}")
    return values


@lru_cache(maxsize=8)
def _advance_statement(count: int) -> str:
    """The UPDATE of :func:`advance_counters` for ``count`` counters (made once: every
    session runs it)."""
    cases = " ".join(["WHEN ? THEN ?"] * count)
    return (
        f"UPDATE event_counters SET value = value + CASE name {cases} END "
        f"WHERE name IN ({', '.join('?' * count)}) RETURNING name, value"
    )
