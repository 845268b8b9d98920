"""Marks every test in this folder ``console``; the console over a real outbox, and the
relay's publishing core to move its events (:mod:`tests.console.harness`)."""

from pathlib import Path

import pytest

from tests.conftest import BACKENDS, backend_url
from tests.support.parts import part_marker

pytest_collection_modifyitems = part_marker(__file__)


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The outbox on SQLite and on PostgreSQL."""
    return backend_url(request, tmp_path)
