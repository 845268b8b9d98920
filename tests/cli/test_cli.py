"""The command line: clear errors on bad input, status output, routes, and the demo."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.helpers import relay_config, write_config
from tidings.cli import app
from tidings.db import make_engine
from tidings.outbox.producer import Outbox

runner = CliRunner()


def _config_file(tmp_path: Path) -> Path:
    return write_config(relay_config(tmp_path), tmp_path / "tidings.yaml")


def test_bad_config_file_exits_2_naming_key_and_value(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("relay:\n  partitions: zero\n")
    result = runner.invoke(app, ["status", "--config", str(bad)])
    assert result.exit_code == 2
    assert "relay.partitions" in result.output and "zero" in result.output


def test_bad_flag_value_is_refused(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["replay", "--config", str(_config_file(tmp_path)), "--every", "often"]
    )
    assert result.exit_code == 2 and "not a duration" in result.output


def test_status_and_routes(tmp_path: Path) -> None:
    path = _config_file(tmp_path)
    config = relay_config(tmp_path)
    outbox = Outbox(make_engine(config.database.url))
    with outbox.transaction() as tx:
        tx.emit("Created", {"n": 1}, partition_key="k")
    result = runner.invoke(app, ["status", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert "PENDING" in result.output and "oldest open event" in result.output
    assert runner.invoke(app, ["routes", "add", "Renamed", "store", "-c", str(path)]).exit_code == 0
    listed = runner.invoke(app, ["routes", "list", "-c", str(path)])
    assert "Created -> store" in listed.output and "Renamed -> store" in listed.output
    unknown = runner.invoke(app, ["routes", "add", "Renamed", "nowhere", "-c", str(path)])
    assert unknown.exit_code == 2 and "unknown target 'nowhere'" in unknown.output
    assert (
        runner.invoke(app, ["routes", "remove", "Renamed", "store", "-c", str(path)]).exit_code == 0
    )
    assert "Renamed" not in runner.invoke(app, ["routes", "list", "-c", str(path)]).output


@pytest.mark.spark
def test_demo_delivers_everything_and_says_so(spark, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "demo",
            "--core",
            "--operations",
            "400",
            "--rate",
            "400",
            "--workdir",
            str(tmp_path / "d"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "OK: every routed event was delivered exactly once, in order." in result.output
    assert "UNROUTABLE" in result.output and "missing 0, duplicates 0" in result.output


def test_a_bad_log_level_is_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["--log-level", "NOPE", "status", "-c", str(_config_file(tmp_path))]
    )
    assert result.exit_code == 2
    assert "not a log level" in result.output and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("event_type", ["", " ", "**", "a*b", "?", "x" * 257])
def test_routes_add_refuses_types_emit_refuses(tmp_path: Path, event_type: str) -> None:
    path = _config_file(tmp_path)
    result = runner.invoke(app, ["routes", "add", event_type, "store", "-c", str(path)])
    assert result.exit_code == 2, result.output
    assert "cannot route it: event type" in result.output
    listed = runner.invoke(app, ["routes", "list", "-c", str(path)])
    assert f"{event_type} ->" not in listed.output.replace("Created ->", "")


def test_routes_add_prints_names_literally(tmp_path: Path) -> None:
    path = _config_file(tmp_path)
    result = runner.invoke(app, ["routes", "add", "Order[red]", "store", "-c", str(path)])
    assert result.exit_code == 0 and "Order[red] -> store added" in result.output


def test_error_messages_keep_brackets(tmp_path: Path) -> None:
    """Errors are printed literally: rich markup would eat a [...] in a path or a name."""
    missing = tmp_path / "conf[prod]" / "tidings.yaml"
    result = runner.invoke(app, ["status", "-c", str(missing)])
    assert result.exit_code == 2 and "conf[prod]" in result.output
    unknown = runner.invoke(app, ["routes", "add", "A", "t[1]", "-c", str(_config_file(tmp_path))])
    assert unknown.exit_code == 2 and "'t[1]'" in unknown.output
