"""Scratch databases on the local PostgreSQL and MariaDB servers, made fresh for a run and
dropped after it, so that no benchmark measures on what another left behind."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg

#: The local PostgreSQL server the benchmarks use (trust auth), without a database.
PG = "postgresql://root@127.0.0.1:5432"


@contextlib.contextmanager
def scratch_database(name: str, template: str | None = None) -> Iterator[str]:
    """A fresh PostgreSQL database on the local server, dropped afterwards; its URL. With
    ``template`` (the URL of a database no one is connected to) a copy of that one."""

    def admin(*statements: str) -> None:
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)  # type: ignore[arg-type]

    copy = "" if template is None else f" TEMPLATE {template.rsplit('/', 1)[1]}"
    admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}{copy}")
    try:
        yield f"{PG}/{name}"
    finally:
        admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


#: The local MariaDB server the benchmarks use (root, no password), without a database.
MARIADB = "mysql://root@127.0.0.1:3306"


@contextlib.contextmanager
def mariadb_scratch_database(name: str) -> Iterator[str]:
    """A fresh MariaDB database on the local server, dropped afterwards; its URL."""
    import pymysql

    def admin(*statements: str) -> None:
        conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
        try:
            with conn.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)
        finally:
            conn.close()

    admin(f"DROP DATABASE IF EXISTS `{name}`", f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    try:
        yield f"{MARIADB}/{name}"
    finally:
        admin(f"DROP DATABASE IF EXISTS `{name}`")


def postgresql_version() -> str:
    """The local server's version."""
    with psycopg.connect(f"{PG}/postgres") as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "unknown"
