"""Engines for SQLite, PostgreSQL and MySQL/MariaDB, configured the same way everywhere.

:func:`make_engine` is the one way tidings makes an engine. SQLite gets WAL (readers never
block the writer), a long busy timeout (the relay and the producer write the same file) and
``synchronous=NORMAL`` (durable at checkpoints, the usual choice with WAL); a caller with
needs of its own (the event store) gives its pragmas and its own ``BEGIN``. PostgreSQL URLs
are pointed at the psycopg 3 driver, MySQL and MariaDB URLs at PyMySQL (utf8mb4), and
pooled connections are checked before use. Code that
writes through the raw driver (the producer, the publisher's outcomes) passes datetimes as
:func:`driver_stamp` says, so that SQLAlchemy reads them back as it wrote them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

#: The pragmas of every SQLite connection whose caller gives none of its own (a caller with
#: more adds to these). The busy timeout comes first, so that switching to WAL waits for a
#: writer of another connection instead of failing at once.
SQLITE_BUSY_TIMEOUT = "PRAGMA busy_timeout=30000"
SQLITE_PRAGMAS = (
    SQLITE_BUSY_TIMEOUT,
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
)

_engines: dict[str, Engine] = {}
_lock = threading.Lock()


#: The dialect names of MySQL and MariaDB (SQLAlchemy names a ``mariadb://`` URL's dialect
#: ``mariadb``); every MySQL-specific branch in tidings tests with :func:`is_mysql`.
MYSQL_DIALECTS = ("mysql", "mariadb")


def is_mysql(dialect: str) -> bool:
    """Whether ``dialect`` (an engine's ``dialect.name``) is MySQL or MariaDB."""
    return dialect in MYSQL_DIALECTS


def driver_url(url: str | URL) -> URL:
    """Parse ``url``; a bare ``postgresql://`` (or ``postgres://``) gets the psycopg 3 driver,
    a bare ``mysql://`` or ``mariadb://`` PyMySQL, with the utf8mb4 character set unless the
    URL names one (MySQL's ``utf8`` is three bytes a character and cannot store every
    payload)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif parsed.drivername in MYSQL_DIALECTS:
        parsed = parsed.set(drivername=f"{parsed.drivername}+pymysql")
    if parsed.get_backend_name() in MYSQL_DIALECTS and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return parsed


def normalise_url(url: str) -> str:
    """:func:`driver_url` as a string, the key of the per-process engine cache."""
    return driver_url(url).render_as_string(hide_password=False)


def placeholder(paramstyle: str) -> str:
    """The raw driver's parameter mark: sqlite3 uses ``?``, psycopg and PyMySQL ``%s``."""
    return "?" if paramstyle == "qmark" else "%s"


def sqlite_text(value: datetime) -> str:
    """The text form SQLAlchemy's SQLite DateTime type stores, for raw driver inserts."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def mysql_stamp(value: datetime) -> datetime:
    """UTC without a zone: a MySQL ``DATETIME`` keeps no zone, and PyMySQL drops an aware
    datetime's offset without converting it, so every stamp is stored as UTC wall time (and
    read back as UTC by :func:`tidings.events.timeutil.as_utc`)."""
    return value.astimezone(UTC).replace(tzinfo=None)


def driver_stamp(dialect: str) -> Callable[[datetime], Any]:
    """How to pass a datetime to the raw driver so that SQLAlchemy reads it back the same."""
    if dialect == "sqlite":
        return sqlite_text
    return mysql_stamp if is_mysql(dialect) else _unchanged


def _unchanged(value: datetime) -> datetime:
    return value


def make_engine(
    url: str | URL,
    *,
    sqlite_pragmas: Sequence[str] = SQLITE_PRAGMAS,
    sqlite_begin: Callable[[Connection], None] | None = None,
    **kwargs: Any,
) -> Engine:
    """Create a new engine with tidings' connection settings.

    On SQLite every new connection runs ``sqlite_pragmas`` in order. ``sqlite_begin``, if
    given, begins every transaction instead of pysqlite, whose implicit ``BEGIN`` cannot be
    ``IMMEDIATE``: the driver's own transaction handling is turned off for it. Other
    ``kwargs`` go to :func:`sqlalchemy.create_engine`.
    """
    parsed = driver_url(url)
    if parsed.get_backend_name() != "sqlite":
        kwargs.setdefault("pool_pre_ping", True)
        return _naming_itself(create_engine(parsed, **kwargs))
    engine = _naming_itself(create_engine(parsed, **kwargs))

    def configure(dbapi_connection: Any, _record: Any) -> None:
        if sqlite_begin is not None:
            dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            for pragma in sqlite_pragmas:
                cursor.execute(pragma)
        finally:
            cursor.close()

    event.listen(engine, "connect", configure)
    if sqlite_begin is not None:
        event.listen(engine, "begin", sqlite_begin)
    return engine


#: The attribute a database error gets: the database it happened on (password hidden), so a
#: one-line error can say which ("unable to open database file" alone does not).
DATABASE_ATTRIBUTE = "tidings_database"


def _naming_itself(engine: Engine) -> Engine:
    """``engine``, whose errors carry its URL (:data:`DATABASE_ATTRIBUTE`)."""
    shown = engine.url.render_as_string(hide_password=True)

    def name(context: Any) -> None:
        # None when the error is not the database's (e.g. an int too large for the driver):
        # naming it then would raise AttributeError in place of the real error.
        if context.sqlalchemy_exception is not None:
            setattr(context.sqlalchemy_exception, DATABASE_ATTRIBUTE, shown)

    event.listen(engine, "handle_error", name)
    return engine


def shared_engine(url: str) -> Engine:
    """One engine per URL per process: Spark tasks in a reused worker share its pool."""
    key = normalise_url(url)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = make_engine(key)
        return engine
