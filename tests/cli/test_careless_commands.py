"""Commands that used to answer carelessly: an id that is not an event id, a target that
does not exist. One line naming the problem, exit 2, nothing changed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidings.cli import app

runner = CliRunner()


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "tidings.yaml"
    path.write_text(
        "database: {url: 'sqlite:///app.db'}\n"
        "targets: {store: {kind: event_store, url: 'sqlite:///ev.db'}}\n"
    )
    return path


@pytest.mark.parametrize(
    "args",
    [
        ["events", "park", "not-a-uuid", "--reason", "x"],
        ["events", "unpark", "not-a-uuid"],
        ["events", "list", "--id", "not-a-uuid"],
        ["events", "resubmit", "--id", "not-a-uuid"],
    ],
)
def test_an_id_that_is_not_an_event_id_is_refused(tmp_path: Path, args: list[str]) -> None:
    result = runner.invoke(app, [*args, "-c", str(_config(tmp_path))])
    assert result.exit_code == 2, result.output
    assert "'not-a-uuid' is not an event id (event ids are UUIDs" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["events", "resubmit", "--target", "nosuch"],
        ["events", "list", "--target", "nosuch"],
        ["routes", "add", "OrderPlaced", "nosuch"],
    ],
)
def test_an_unknown_target_is_refused_the_same_way_everywhere(
    tmp_path: Path, args: list[str]
) -> None:
    result = runner.invoke(app, [*args, "-c", str(_config(tmp_path))])
    assert result.exit_code == 2, result.output
    assert "unknown target 'nosuch' (defined: store)" in result.output
    assert "resubmitted" not in result.output
