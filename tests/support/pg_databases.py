"""Empty PostgreSQL databases for tests, one per test, without creating one per test.

``CREATE DATABASE`` copies the template (0.2-0.4 s, more on a busy machine) and ``DROP
DATABASE`` costs again: with about 150 PostgreSQL tests in the server's part alone, that was
half of its run. A database a test is done with is instead renamed and emptied (its schemas
dropped, ``public`` made again as a new database has it), and the next test gets it: as
empty as a new one, under a name no test has used before, so nothing that remembers a
database by its URL (a process-wide cache of targets, say) can mistake it for the previous
test's. A database that cannot be emptied is dropped; all are dropped at the end of the run.
"""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql

#: The schemas a test made (every schema but the system's and ``public``).
_TEST_SCHEMAS = (
    "SELECT nspname FROM pg_namespace "
    "WHERE nspname NOT IN ('information_schema', 'public') AND nspname NOT LIKE 'pg\\_%'"
)
#: What is left in the schemas a test may use: nothing, once emptied.
_LEFT = (
    "SELECT count(*) FROM pg_class JOIN pg_namespace ON pg_namespace.oid = relnamespace "
    "WHERE nspname NOT IN ('information_schema', 'pg_catalog', 'pg_toast')"
)
#: ``public`` as ``CREATE DATABASE`` makes it from template1 (PostgreSQL 15).
_NEW_PUBLIC = (
    "CREATE SCHEMA public AUTHORIZATION pg_database_owner",
    "GRANT USAGE ON SCHEMA public TO PUBLIC",
    "COMMENT ON SCHEMA public IS 'standard public schema'",
)


class DatabaseUnreachable(Exception):
    """The PostgreSQL server refused the pool's connection (the first line of its reason)."""


class PgDatabases:
    """Empty databases on the server at ``server`` (``HOST:PORT``, user ``postgres``,
    trust), named ``tidings_test_<random>``."""

    def __init__(self, server: str) -> None:
        self._server = server
        self._admin: psycopg.Connection[tuple[object, ...]] | None = None
        #: Emptied databases, ready for the next test.
        self._free: list[str] = []

    def take(self) -> str:
        """The name of an empty database for one test; give it back when the test is done."""
        if self._free:
            return self._free.pop()
        name = _new_name()
        self._execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def give_back(self, name: str) -> None:
        """``name`` is no longer used: renamed and emptied for the next test, or dropped if
        that fails (a session that will not end, an object a schema does not hold)."""
        fresh = _new_name()
        try:
            self._disconnect_all(name)
            # Renamed first: PostgreSQL waits for the ended sessions to leave (as a drop
            # does), and the emptying session may then leave at its own pace.
            self._execute(
                sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                    sql.Identifier(name), sql.Identifier(fresh)
                )
            )
        except psycopg.Error:
            self._drop(name)
            return
        try:
            emptied = _empty(self._conninfo(fresh))
        except psycopg.Error:
            emptied = False
        if emptied:
            self._free.append(fresh)
        else:
            self._drop(fresh)

    def close(self) -> None:
        """Drop the databases waiting for a test, and close the server connection."""
        while self._free:
            self._drop(self._free.pop())
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def _conninfo(self, database: str) -> str:
        host, _, port = self._server.rpartition(":")
        return f"host={host} port={port} user=postgres dbname={database} connect_timeout=5"

    def _execute(self, statement: sql.Composable, *params: object) -> None:
        if self._admin is None or self._admin.closed:  # never opened, or lost
            try:
                self._admin = psycopg.connect(self._conninfo("postgres"), autocommit=True)
            except psycopg.OperationalError as exc:
                raise DatabaseUnreachable(str(exc).splitlines()[0]) from None
        self._admin.execute(statement, params or None)

    def _disconnect_all(self, name: str) -> None:
        """End every session on ``name`` (a test's leaked connection, say), as ``DROP
        DATABASE ... WITH (FORCE)`` did, so that it can be emptied and renamed."""
        self._execute(
            sql.SQL(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()"
            ),
            name,
        )

    def _drop(self, name: str) -> None:
        self._execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _new_name() -> str:
    return f"tidings_test_{uuid.uuid4().hex[:12]}"


def _empty(conninfo: str) -> bool:
    """Drop every schema of the database and make ``public`` again as new; whether nothing
    is left outside the system's schemas then."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        schemas = [row[0] for row in conn.execute(_TEST_SCHEMAS).fetchall()]
        for schema in [*schemas, "public"]:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        for statement in _NEW_PUBLIC:
            conn.execute(statement)
        left = conn.execute(_LEFT).fetchone()
    return left is not None and left[0] == 0
