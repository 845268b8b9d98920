"""Empty MySQL/MariaDB databases for tests, one per test, on the local server.

On MariaDB a database is a directory: ``CREATE DATABASE`` and ``DROP DATABASE`` of an
empty or small one take milliseconds (PostgreSQL's copy of a template is what
:mod:`tests.support.pg_databases` works around), so each test gets a new one under a name
no test used before, dropped when it is done.
"""

from __future__ import annotations

import contextlib
import uuid

import pymysql

#: The local server (``.ci/run`` starts it when it is down): root, no password.
MYSQL_HOST, MYSQL_PORT = "127.0.0.1", 3306


class MysqlUnreachable(Exception):
    """The MariaDB server refused the connection (the reason)."""


def _admin() -> pymysql.connections.Connection:  # type: ignore[type-arg]
    try:
        return pymysql.connect(
            host=MYSQL_HOST, port=MYSQL_PORT, user="root", password="", autocommit=True
        )
    except pymysql.err.OperationalError as exc:
        raise MysqlUnreachable(str(exc)) from None


def create_database() -> str:
    """A new empty database's name (utf8mb4, as tidings' tables are)."""
    name = f"tidings_test_{uuid.uuid4().hex[:12]}"
    with _admin() as conn, conn.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    return name


def drop_database(name: str) -> None:
    """Drop ``name``, ending the sessions still on it (a test's leaked connection)."""
    with _admin() as conn, conn.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM information_schema.PROCESSLIST WHERE db = %s AND id <> CONNECTION_ID()",
            (name,),
        )
        for (session,) in cursor.fetchall():
            with contextlib.suppress(pymysql.err.OperationalError):  # ended meanwhile
                cursor.execute(f"KILL {int(session)}")
        cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")


def mysql_url(name: str) -> str:
    return f"mysql://root@{MYSQL_HOST}:{MYSQL_PORT}/{name}"
