"""Marks every test in this folder ``pipeline``: ``pytest -m pipeline`` runs them; the
application database the publisher's tests emit into."""

from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.conftest import LOG_BACKENDS, log_database_url
from tests.support.parts import part_marker
from tidings.db import make_engine

pytest_collection_modifyitems = part_marker(__file__)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    """A SQLite application database in the test's own folder."""
    return make_engine(f"sqlite:///{tmp_path / 'app.db'}")


@pytest.fixture(params=LOG_BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The event log's backends, MySQL/MariaDB too (:func:`tests.conftest.log_database_url`)."""
    return log_database_url(request, tmp_path)
