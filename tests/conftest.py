"""Shared fixtures: one local SparkSession for the whole run, and the databases storage tests
run on: a SQLite file, or a fresh database on the real PostgreSQL server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from tidings.config import RelayConfig

PG_SERVER = "127.0.0.1:5432"
PG_ADMIN_URL = f"postgresql+psycopg://postgres@{PG_SERVER}/postgres"
#: How .ci/run starts the local PostgreSQL when it is down.
PG_START = 'pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start'

#: The backends of a test that runs on both: one spelling of their ids in every test name.
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for every test: a cold start costs 4-9 s."""
    from tidings.pipeline.spark import spark_session

    session = spark_session(RelayConfig(shuffle_partitions=2), app_name="tidings-tests")
    yield session
    session.stop()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database on the local server, dropped afterwards.

    A server that is down fails the test, with the command that starts it: a skip would let a
    run pass without the PostgreSQL half of the suite. (``-m "not postgres"`` leaves it out.)
    """
    name = f"tidings_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(
        PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5}
    )
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        reason = str(exc.orig).splitlines()[0]
        raise pytest.fail.Exception(
            f"PostgreSQL is not reachable on {PG_SERVER} ({reason}). Start it with\n"
            f"    {PG_START}\nor leave its tests out with -m 'not postgres'.",
            pytrace=False,
        ) from None
    try:
        yield f"postgresql://postgres@{PG_SERVER}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend: a SQLite file in the test's directory, or a fresh
    PostgreSQL database (:func:`pg_url`)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url
