"""``tidings status`` and ``tidings events`` on a log in the real local MariaDB: what an
operator types and reads is the same as on SQLite (tests/cli/test_events.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.helpers import relay_config, statuses, write_config
from tests.support.publisher_helpers import Refusing, emit_all, local_store, logged_rows
from tidings.cli import app
from tidings.db import make_engine
from tidings.pipeline.publishing.publisher import Publisher
from tidings.routing.table import merge_routes

pytestmark = pytest.mark.mysql
runner = CliRunner()


def _invoke(*args: str) -> object:
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    return result


def test_status_and_events_on_mariadb(tmp_path: Path, mysql_url: str) -> None:
    """A FAILED poison (seq 2) holding seq 3 and an UNROUTABLE event (seq 4): listed,
    blocked, counted by ``status``, parked and resubmitted."""
    config = relay_config(tmp_path, mysql_url, routes={"A": ["store"]})
    engine = make_engine(config.database.url)
    emit_all(
        engine,
        [
            ("A", "k", {"n": 1}),
            ("A", "k", {"n": "poison"}),
            ("A", "k", {"n": 3}),
            ("Later", "k2", {}),
        ],
    )
    store = Refusing("store", local_store(tmp_path, "events"), "poison")
    Publisher(engine, merge_routes({"A": ["store"]}), {"store": store}.get, [0.0]).run(
        logged_rows(engine)
    )
    ids = [row.event.event_id for row in logged_rows(engine)]
    path = str(write_config(config, tmp_path / "tidings.yaml"))

    listed = _invoke("events", "list", "-c", path, "--json", "--status", "failed")
    records = [json.loads(line) for line in listed.output.splitlines() if line.startswith("{")]
    assert [r["seq"] for r in records] == [2]
    assert records[0]["targets"]["store"]["state"] == "failed"
    blocked = _invoke("events", "blocked", "-c", path)
    assert blocked.exit_code == 0 and ids[1] in blocked.output

    status = _invoke("status", "-c", path, "--json")
    report = json.loads(status.output)
    counts = {name: n for name, n in report["counts"].items() if n}
    assert counts == {"FAILED": 1, "HELD": 1, "UNROUTABLE": 1}

    parked = _invoke("events", "park", ids[1], "--reason", "bad payload", "-c", path)
    assert parked.exit_code == 0 and f"parked {ids[1]}" in parked.output
    assert statuses(engine)[2] == "PARKED"
    unparked = _invoke("events", "unpark", ids[1], "-c", path)
    assert unparked.exit_code == 0 and "resubmitted 1" in unparked.output
    assert statuses(engine)[2] == "PENDING"
