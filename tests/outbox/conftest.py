"""Marks every test in this folder ``outbox``: ``pytest -m outbox`` runs them."""

from pathlib import Path

import pytest

from tests.conftest import LOG_BACKENDS, log_database_url
from tests.support.parts import part_marker

pytest_collection_modifyitems = part_marker(__file__)


@pytest.fixture(params=LOG_BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The event log's backends, MySQL/MariaDB too (:func:`tests.conftest.log_database_url`)."""
    return log_database_url(request, tmp_path)
