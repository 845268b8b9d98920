"""The database layer under the event store: its engine, transactions and append lock.

The store's engine comes from :func:`tidings.db.make_engine` with the store's SQLite pragmas
and its own ``BEGIN``. Appends are serialized database-wide (SQLite ``BEGIN IMMEDIATE``,
PostgreSQL transaction-scoped advisory lock), so positions become visible in increasing
order and a reader following positions never skips one. Registrations run plain SQL on one
kept connection (:class:`Writer`, :class:`DriverCursor`); on SQLite a thread of the store's
own copies the write-ahead log into the database (:class:`Checkpointer`). Database failures
leave as :class:`~tidings.errors.StoreError` naming the store and what it was doing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from tidings.db import SQLITE_BUSY_TIMEOUT, SQLITE_PRAGMAS, driver_url, make_engine
from tidings.errors import StoreBusy, StoreError
from tidings.redaction import shown_url

log = logging.getLogger(__name__)

#: Key of the PostgreSQL advisory lock that serializes appends ("tidings1" in ASCII).
_PG_APPEND_LOCK_KEY = 0x74696469_6E677331
_PG_APPEND_LOCK = text("SELECT pg_advisory_xact_lock(:key)")
#: Execution option telling the SQLite ``begin`` hook to take the write lock up front.
_APPEND_OPTION = "tidings_event_store_append"
#: The busy timeout of the writer's kept connection between the waits it takes on purpose.
_NO_BUSY_WAIT = "PRAGMA busy_timeout = 0"
#: tidings' pragmas of every SQLite connection (WAL, the busy timeout), then the store's own.
STORE_SQLITE_PRAGMAS = (
    *SQLITE_PRAGMAS,
    "PRAGMA foreign_keys = ON",
    # 32 MiB per connection (allocated as used): random outbox ids touch the whole index.
    "PRAGMA cache_size = -32768",
    # Commits leave checkpoints to the store's own thread (Checkpointer); this one, at
    # ~40 MiB of WAL, is only the backstop if that thread falls behind.
    "PRAGMA wal_autocheckpoint = 10000",
)
#: How often the checkpoint thread copies the WAL into the database (SQLite).
_CHECKPOINT_INTERVAL_S = 0.5


def parse_url(url: str) -> URL:
    """Parse and check ``url``; a bare ``postgresql://`` gets the psycopg 3 driver."""
    try:
        parsed = driver_url(url)
    except ArgumentError:
        # Not SQLAlchemy's message: it quotes the whole URL, password included.
        raise StoreError(f"event store: invalid database url {shown_url(url)}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise StoreError("event store: an in-memory SQLite database is not durable; give a file")
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(f"event store: unsupported database {backend!r}; use sqlite or postgresql")
    return parsed


def store_engine(url: URL) -> Engine:
    """The store's engine: on SQLite with its pragmas and its own ``BEGIN``."""
    return make_engine(
        url, sqlite_pragmas=STORE_SQLITE_PRAGMAS, sqlite_begin=_begin_sqlite_transaction
    )


def _begin_sqlite_transaction(conn: Connection) -> None:
    """Begin an append with the write lock held, so appends cannot interleave or deadlock."""
    immediate = conn.get_execution_options().get(_APPEND_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


@contextmanager
def transaction(
    engine: Engine,
    url: str,
    action: str,
    *,
    append: bool = False,
    snapshot: bool = False,
    write: bool = False,
    schema: bool = False,
) -> Iterator[Connection]:
    """Run one transaction; an append one holds the database-wide append lock, a snapshot
    one reads a single state of the database (``REPEATABLE READ READ ONLY`` on PostgreSQL).

    A ``write`` one (and an append one) takes SQLite's write lock when it begins, waiting
    for it as long as the busy timeout allows: a transaction begun for reading that then
    writes fails at once with "database is locked" when another connection has committed
    since it began (WAL mode cannot let it write on a stale snapshot).

    A ``schema`` one runs on SQLite with foreign keys unenforced (the pragma works only
    outside a transaction): rebuilding a table drops it, and with enforcement on, the drop
    deletes its rows first, which cascades into (or fails for) a table of the user's that
    refers to it. Its caller checks the keys before it commits.

    Database failures leave as :class:`StoreError` naming the store (``url``) and ``action``.
    """
    try:
        with engine.connect() as conn:
            postgresql = conn.dialect.name == "postgresql"
            if append or write:
                conn.execution_options(**{_APPEND_OPTION: True})
            if snapshot and postgresql:
                conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            unenforced = schema and not postgresql
            if unenforced:
                _sqlite_pragma(conn, "PRAGMA foreign_keys = OFF")
            try:
                with conn.begin():
                    if append and postgresql:
                        conn.execute(_PG_APPEND_LOCK, {"key": _PG_APPEND_LOCK_KEY})
                    yield conn
            finally:
                if unenforced:
                    _sqlite_pragma(conn, "PRAGMA foreign_keys = ON")
    except SQLAlchemyError as exc:
        raise StoreError(f"event store {url}: cannot {action}: {_cause(exc)}") from exc


def _sqlite_pragma(conn: Connection, pragma: str) -> None:
    """Run ``pragma`` on the driver's connection, outside SQLAlchemy's transaction (which
    executing it through ``conn`` would begin)."""
    driver = conn.connection.driver_connection
    assert driver is not None  # the connection is open: it has its DBAPI connection
    driver.execute(pragma)


def _cause(exc: SQLAlchemyError) -> str:
    """The driver's own error if there is one: shorter than SQLAlchemy's statement dump."""
    cause: BaseException = exc.orig if isinstance(exc, DBAPIError) and exc.orig else exc
    return f"{type(cause).__name__}: {cause}"


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

    def copy_rows(
        self, statement: str, types: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """PostgreSQL: run ``statement`` (a ``COPY ... FROM STDIN (FORMAT BINARY)``) with
        ``rows``, each value sent as its column's type in ``types``. A failing row fails
        the whole statement, as an INSERT of them all would."""
        with self.cursor.copy(statement) as copy:
            copy.set_types(types)
            for row in rows:
                copy.write_row(row)

    def _marked(self, statement: str) -> str:
        return statement.replace("?", "%s") if self.postgresql else statement


class HeldState(Protocol):
    """What a store keeps in memory while a held transaction is open (numbers, caches), told
    by the :class:`Writer` of the transaction's turns, under the writer's lock: so that what
    it remembers always matches what the transaction holds."""

    def opened(self) -> None:
        """A held transaction was begun (for the write that follows)."""

    def write_started(self) -> None:
        """A write begins, in a savepoint of its own."""

    def write_undone(self) -> None:
        """The write was rolled back to its savepoint; the held writes before it stay."""

    def before_commit(self, raw: DriverCursor) -> None:
        """The held transaction is about to be committed: write what was kept in memory."""

    def committed(self) -> None:
        """The held transaction was committed: its writes are durable."""

    def rolled_back(self) -> None:
        """The held transaction was rolled back: its writes are gone."""


class Writer:
    """The connection registrations are written on, kept for the store's whole life.

    Checking a connection out of the pool for every register, with its events, cost more
    than a small register; one kept connection, used under a lock, costs nothing. Appends of
    other stores and processes are still serialized by the database (``BEGIN IMMEDIATE`` on
    SQLite, the advisory lock on PostgreSQL). A connection that fails is dropped and the
    next register opens a new one.

    With :attr:`held` set (the server's ``durability: periodic``) a transaction stays open
    after its writes, each write in a savepoint of its own, until :meth:`flush` commits it:
    the pages a small register dirties (the events table, its indexes, the counters) are
    written once per flush instead of once per commit, about half a small register's cost
    on SQLite. A failing write rolls back to its savepoint, so the writes before it stay.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._postgresql = engine.dialect.name == "postgresql"
        self._driver_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        self._lock = threading.Lock()
        self._connection: Any = None
        #: Keep transactions open until :meth:`flush`, telling this of their turns (set
        #: before the first write).
        self.held: HeldState | None = None
        #: A held transaction is open (it holds the append lock and uncommitted writes).
        self._open = False
        #: Why held writes were lost (None while none were): answered registrations are
        #: gone and the counters went back, so no further write is taken; the server stops
        #: and a restart starts from what is committed.
        self.failed: str | None = None

    @property
    def unflushed(self) -> bool:
        """Writes are waiting in a held transaction for :meth:`flush`."""
        return self._open

    @contextmanager
    def transaction(self, url: str, wait: bool = True) -> Iterator[DriverCursor]:
        """One append transaction (a savepoint of the held one, with :attr:`held`); database
        errors leave as :class:`StoreError`, and :class:`StoreBusy` if ``wait`` is off and
        another writer holds the append lock."""
        with self._lock:
            if self.failed is not None:
                raise StoreError(f"event store {url}: {self.failed}; restart the server")
            saved = False
            try:
                if self._connection is None:
                    self._connection = self._open_connection()
                raw = self._cursor()
                if not self._open:
                    self._lock_appends(raw, url, wait)
                    self._open = True
                    if self.held is not None:
                        self.held.opened()
                if self.held is not None:
                    raw.rows("SAVEPOINT tidings_write")
                    saved = True
                    self.held.write_started()
                yield raw
                if self.held is not None:
                    raw.rows("RELEASE SAVEPOINT tidings_write")
                else:
                    self._commit(raw)
            except BaseException as exc:
                if saved and self._undo_write():
                    assert self.held is not None
                    self.held.write_undone()
                else:
                    self._rollback()
                if isinstance(exc, self._driver_error):
                    raise StoreError(
                        f"event store {url}: cannot register: {type(exc).__name__}: {exc}"
                    ) from exc
                raise

    def flush(self, url: str) -> None:
        """Commit the held transaction, if one is open."""
        with self._lock:
            if not self._open:
                return
            try:
                self._commit(self._cursor())
            except self._driver_error as exc:
                self._rollback()
                raise StoreError(
                    f"event store {url}: cannot commit held writes: {type(exc).__name__}: {exc}"
                ) from exc

    def _open_connection(self) -> Any:
        """The kept connection. On SQLite its savepoints' undo journal (each held write
        keeps the pages it changes there) is kept in memory: in a temporary file it cost
        held writes of 100 events about a third more (measured). It holds the pages one
        write changes, until the write ends: a held register of 50,000 events with random
        outbox ids into a 100 MiB store took 17 MiB more at its peak (measured). Only this
        connection's: readers' large sorts may still spill to disk.

        Its busy timeout is 0: it waits for SQLite's write lock only when a write that may
        wait begins (:meth:`_lock_appends`), and inside its transactions, which hold that
        lock, nothing waits for another. Switching the timeout off and on around each write
        that must not wait (the event loop's) cost a small commit-mode register two
        statements, a fifth of its time in the store (a one-event commit took 118 µs with
        them and 96 without, measured)."""
        connection = self._engine.raw_connection()
        if not self._postgresql:
            driver = connection.driver_connection
            assert driver is not None  # a connection checked out of the pool has its own
            driver.execute("PRAGMA temp_store = MEMORY")
            driver.execute(_NO_BUSY_WAIT)
        return connection

    def _cursor(self) -> DriverCursor:
        return DriverCursor(
            self._connection.driver_connection.cursor(), self._postgresql, self._driver_error
        )

    def _commit(self, raw: DriverCursor) -> None:
        if self.held is not None:
            self.held.before_commit(raw)
        if self._postgresql:
            self._connection.driver_connection.commit()
        else:
            raw.rows("COMMIT")
        self._open = False
        if self.held is not None:
            self.held.committed()

    def _undo_write(self) -> bool:
        """Roll a failed write back to its savepoint, keeping the held writes before it;
        False if that failed too (the whole transaction must go)."""
        try:
            raw = self._cursor()
            raw.rows("ROLLBACK TO SAVEPOINT tidings_write")
            raw.rows("RELEASE SAVEPOINT tidings_write")
        except Exception:
            return False
        return True

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
        else:
            locked = self._try_begin(raw)
            if not locked and wait:
                # Someone else writes: wait for the lock as long as the busy timeout says.
                raw.rows(SQLITE_BUSY_TIMEOUT)
                try:
                    raw.rows("BEGIN IMMEDIATE")
                finally:
                    raw.rows(_NO_BUSY_WAIT)
                return
        if not locked:
            raise StoreBusy(f"event store {url}: another writer holds the append lock")

    def _try_begin(self, raw: DriverCursor) -> bool:
        """``BEGIN IMMEDIATE`` without waiting (the connection's busy timeout is 0); False
        if another writer holds SQLite's write lock."""
        try:
            raw.rows("BEGIN IMMEDIATE")
        except self._driver_error as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            return False
        return True

    def _rollback(self) -> None:
        """Roll back; a connection that cannot even do that is dropped. Held writes that are
        rolled back are lost as a crash would lose them: said in the log."""
        if self._connection is None:
            return
        if self.held is not None and self._open:
            self.failed = "answered registrations held for the next commit were rolled back"
            log.error("event store: %s (a database error)", self.failed)
            self.held.rolled_back()
        self._open = False
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


class Checkpointer:
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
