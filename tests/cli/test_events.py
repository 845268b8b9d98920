"""``tidings events`` and ``routes add --redrive`` on a real SQLite log: what an operator
types and reads, and the exit codes a script relies on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.helpers import relay_config, statuses
from tidings.cli import app
from tidings.db import make_engine

runner = CliRunner()


def _invoke(*args: str) -> object:
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    return result


def test_list_shows_status_targets_and_reasons(incomplete_log: tuple[Path, list[str]]) -> None:
    path, ids = incomplete_log
    listed = _invoke("events", "list", "-c", str(path))
    assert listed.exit_code == 0, listed.output
    for needle in (ids[1], "FAILED", "refused 2", "HELD", "held behind unpublished seq 2"):
        assert needle in listed.output
    as_json = _invoke("events", "list", "-c", str(path), "--json", "--status", "failed")
    records = [json.loads(line) for line in as_json.output.splitlines() if line.startswith("{")]
    assert [r["seq"] for r in records] == [2]
    assert records[0]["targets"]["store"]["state"] == "failed"
    blocked = _invoke("events", "blocked", "-c", str(path))
    assert blocked.exit_code == 0 and ids[1] in blocked.output


def test_park_unpark_and_resubmit(incomplete_log: tuple[Path, list[str]], tmp_path: Path) -> None:
    path, ids = incomplete_log
    engine = make_engine(relay_config(tmp_path).database.url)
    parked = _invoke("events", "park", ids[1], "--reason", "bad [payload]", "-c", str(path))
    assert parked.exit_code == 0 and f"parked {ids[1]}" in parked.output
    assert statuses(engine)[2] == "PARKED"
    again = _invoke("events", "park", ids[1], "--reason", "x", "-c", str(path))
    assert again.exit_code == 1 and "not parked" in again.output
    no_reason = _invoke("events", "park", ids[1], "--reason", " ", "-c", str(path))
    assert no_reason.exit_code == 2 and "needs a reason" in no_reason.output
    unparked = _invoke("events", "unpark", ids[1], "-c", str(path))
    assert unparked.exit_code == 0 and "resubmitted 1" in unparked.output
    assert statuses(engine)[2] == "PENDING"
    none = _invoke("events", "resubmit", "-c", str(path))  # nothing FAILED now
    assert none.exit_code == 0 and "resubmitted 0" in none.output


def test_routes_add_redrive_sends_the_unroutable_events(
    incomplete_log: tuple[Path, list[str]], tmp_path: Path
) -> None:
    path, _ = incomplete_log
    engine = make_engine(relay_config(tmp_path).database.url)
    assert statuses(engine)[4] == "UNROUTABLE"
    hint = _invoke("routes", "add", "Lat*", "store", "-c", str(path))
    assert hint.exit_code == 0 and "1 UNROUTABLE event(s) match it" in hint.output
    assert statuses(engine)[4] == "UNROUTABLE"
    redriven = _invoke("routes", "add", "Later", "store", "--redrive", "-c", str(path))
    assert redriven.exit_code == 0 and "re-driven: 1" in redriven.output
    assert statuses(engine)[4] == "PENDING"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["events", "list", "--status", "DONE"], "is not a status"),
        (["events", "list", "--older-than", "soon"], "not a duration"),
        (["events", "list", "--limit", "0"], "greater than or equal to 1"),
        (["events", "resubmit", "--status", "PUBLISHED"], "status must be one of"),
        (["events", "park", "x"], "--reason"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(
    incomplete_log: tuple[Path, list[str]], args: list[str], message: str
) -> None:
    path, _ = incomplete_log
    result = _invoke(*args, "-c", str(path))
    assert result.exit_code == 2 and message in result.output
