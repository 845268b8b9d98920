"""Engines for SQLite and PostgreSQL, configured the same way everywhere in tidings.

SQLite gets WAL (readers never block the writer), a long busy timeout (the relay and the
producer write the same file) and ``synchronous=NORMAL`` (durable at checkpoints, the
usual choice with WAL). PostgreSQL URLs are pointed at the psycopg 3 driver.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def driver_url(url: str) -> URL:
    """Parse ``url``; a bare ``postgresql://`` (or ``postgres://``) gets the psycopg 3 driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def normalise_url(url: str) -> str:
    """:func:`driver_url` as a string, the key of the per-process engine cache."""
    return driver_url(url).render_as_string(hide_password=False)


def placeholder(paramstyle: str) -> str:
    """The raw driver's parameter mark: sqlite3 uses ``?``, psycopg ``%s``."""
    return "?" if paramstyle == "qmark" else "%s"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create a new engine with tidings' connection settings."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def shared_engine(url: str) -> Engine:
    """One engine per URL per process: Spark tasks in a reused worker share its pool."""
    key = normalise_url(url)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = make_engine(key)
        return engine
