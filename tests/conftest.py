"""Shared fixtures: one local SparkSession for the whole run, real databases, real NATS."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from tidings.config import RelayConfig

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for every test: a cold start costs 4-9 s."""
    from tidings.pipeline.spark import spark_session

    session = spark_session(RelayConfig(shuffle_partitions=2), app_name="tidings-tests")
    yield session
    session.stop()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database on the local server, dropped afterwards."""
    name = f"tidings_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
