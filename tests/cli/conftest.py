"""Marks every test in this folder ``cli``: ``pytest -m cli`` runs them; and the incomplete
events that the ``events`` commands' tests work on."""

from pathlib import Path

import pytest

from tests.support.helpers import relay_config, write_config
from tests.support.parts import part_marker
from tests.support.publisher_helpers import Refusing, emit_all, local_store, logged_rows
from tidings.db import make_engine
from tidings.pipeline.publishing.publisher import Publisher
from tidings.routing.table import merge_routes

pytest_collection_modifyitems = part_marker(__file__)


@pytest.fixture
def incomplete_log(tmp_path: Path) -> tuple[Path, list[str]]:
    """A real SQLite log with a FAILED poison (seq 2) holding seq 3, and an UNROUTABLE event
    (seq 4); its configuration file and the events' ids."""
    config = relay_config(tmp_path, routes={"A": ["store"]})
    engine = make_engine(config.database.url)
    emit_all(
        engine,
        [
            ("A", "k", {"n": 1}),
            ("A", "k", {"n": "poison"}),
            ("A", "k", {"n": 3}),
            ("Later", "k2", {"n": 4}),
        ],
    )
    store = Refusing("store", local_store(tmp_path, "events"), "poison")
    Publisher(engine, merge_routes({"A": ["store"]}), {"store": store}.get, [0.0]).run(
        logged_rows(engine)
    )
    ids = [row.event.event_id for row in logged_rows(engine)]
    return write_config(config, tmp_path / "tidings.yaml"), ids
