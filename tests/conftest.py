"""Shared fixtures: one local SparkSession for the whole run, and the databases storage tests
run on: a SQLite file, or an empty database of its own on the real PostgreSQL server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import mysql_databases
from tests.support.pg_databases import DatabaseUnreachable, PgDatabases
from tidings.config import RelayConfig

PG_SERVER = "127.0.0.1:5432"
#: How .ci/run starts the local PostgreSQL when it is down.
PG_START = 'pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start'

#: The backends of a test that runs on both: one spelling of their ids in every test name.
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
#: The backends of the event log (the outbox, the relay's reads and writes): MySQL/MariaDB
#: too. Folders whose tests are about the log run ``database_url`` on these
#: (:func:`log_database_url`).
LOG_BACKENDS = [*BACKENDS, pytest.param("mysql", marks=pytest.mark.mysql)]
#: How .ci/run starts the local MariaDB when it is down.
MYSQL_START = "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"


#: Where ``tmp_path`` lives when this machine has it: a tmpfs, as /tmp often is not. The
#: storage tests commit thousands of times, and on a disk each commit waits for a sync.
MEMORY_TEMPROOT = "/dev/shm"


def pytest_configure(config: pytest.Config) -> None:
    """Test directories on :data:`MEMORY_TEMPROOT` where it is writable, unless the run
    chose a place (``--basetemp``, ``PYTEST_DEBUG_TEMPROOT``); elsewhere the system's
    temporary directory, as pytest's default."""
    if "PYTEST_DEBUG_TEMPROOT" not in os.environ and os.access(MEMORY_TEMPROOT, os.W_OK):
        os.environ["PYTEST_DEBUG_TEMPROOT"] = MEMORY_TEMPROOT


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for every test: a cold start costs 4-9 s."""
    from tidings.pipeline.spark import spark_session

    session = spark_session(RelayConfig(shuffle_partitions=2), app_name="tidings-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[PgDatabases]:
    """The run's empty PostgreSQL databases, reused from test to test (see
    :mod:`tests.support.pg_databases`); dropped at the end of the run."""
    databases = PgDatabases(PG_SERVER)
    yield databases
    databases.close()


@pytest.fixture
def pg_url(pg_databases: PgDatabases) -> Iterator[str]:
    """An empty PostgreSQL database on the local server, of this test alone.

    A server that is down fails the test, with the command that starts it: a skip would let a
    run pass without the PostgreSQL half of the suite. (``-m "not postgres"`` leaves it out.)
    """
    try:
        name = pg_databases.take()
    except DatabaseUnreachable as exc:
        raise pytest.fail.Exception(
            f"PostgreSQL is not reachable on {PG_SERVER} ({exc}). Start it with\n"
            f"    {PG_START}\nor leave its tests out with -m 'not postgres'.",
            pytrace=False,
        ) from None
    try:
        yield f"postgresql://postgres@{PG_SERVER}/{name}"
    finally:
        pg_databases.give_back(name)


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend: a SQLite file in the test's directory, or a fresh
    PostgreSQL database (:func:`pg_url`)."""
    return backend_url(request, tmp_path)


def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The empty database of ``request.param`` (a :data:`LOG_BACKENDS` id)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    url: str = request.getfixturevalue("mysql_url" if request.param == "mysql" else "pg_url")
    return url


def log_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """``database_url`` of the folders about the event log: also on MySQL/MariaDB. Their
    conftest.py makes it their ``database_url`` (a fixture of the same name)."""
    return backend_url(request, tmp_path)


@pytest.fixture
def mysql_url() -> Iterator[str]:
    """An empty database on the local MariaDB, of this test alone, dropped after it.

    A server that is down fails the test, with the command that starts it (as
    :func:`pg_url`); ``-m 'not mysql'`` leaves these tests out.
    """
    try:
        name = mysql_databases.create_database()
    except mysql_databases.MysqlUnreachable as exc:
        raise pytest.fail.Exception(
            f"MariaDB is not reachable on {mysql_databases.MYSQL_HOST}:"
            f"{mysql_databases.MYSQL_PORT} ({exc}). Start it with\n    {MYSQL_START}\n"
            "or leave its tests out with -m 'not mysql'.",
            pytrace=False,
        ) from None
    try:
        yield mysql_databases.mysql_url(name)
    finally:
        from tidings.db import _engines

        for key in [k for k in _engines if name in k]:  # the shared engines of this database
            _engines.pop(key).dispose()
        mysql_databases.drop_database(name)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and localhost, a client certificate, and a
    second CA that signed neither (:mod:`tests.support.certificates`), once per run: their
    files by name (``ca.pem``, ``other-ca.pem``, ``server.pem``/``.key``,
    ``client.pem``/``.key``)."""
    from tests.support.certificates import TestCA

    directory = tmp_path_factory.mktemp("tls")
    ca, other = TestCA(directory), TestCA(directory, "other")
    server, client = ca.server(), ca.client("client")
    files = {"ca.pem": ca.cert, "other-ca.pem": other.cert, "server.pem": server.cert}
    files |= {"server.key": server.key, "client.pem": client.cert, "client.key": client.key}
    return {name: str(path) for name, path in files.items()}


@pytest.fixture
def forgotten_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """No secret remembered from files earlier tests of this process read: a test that
    checks a secret is never shown must not pass because another test's file taught the
    process to scrub it (:mod:`tidings.redaction`)."""
    from tidings import redaction

    monkeypatch.setattr(redaction, "_remembered", set())
    monkeypatch.setattr(redaction, "_ordered", ())
