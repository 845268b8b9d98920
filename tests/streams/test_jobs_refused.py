"""``tidings streams archive`` and ``aggregate`` refuse a source they cannot consume in one
line and exit 2, before Spark starts: inside the query each of these was a failed query and
some 400 lines of Java and Python. Real processes, a real stream server, a real socket
nobody listens on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from bench.harness.processes import free_port
from tests.support.cli_runs import one_error_line, run_tidings
from tests.support.stream_helpers import PASSWORD, USER, serving_in_thread, stream_server_config

pytestmark = pytest.mark.sockets


def _tidings(*args: str, password: str = PASSWORD) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"TIDINGS_STREAM_USER": USER, "TIDINGS_STREAM_PASSWORD": password}
    return run_tidings("streams", *args, env=env)


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    line = one_error_line(result)
    assert "spark" not in result.stderr.lower()  # refused before Spark started
    return line


def _archive(url: str, tmp_path: Path, *extra: str, password: str = PASSWORD) -> str:
    return _one_line(
        _tidings(
            "archive",
            url,
            "--dir",
            str(tmp_path / "archive"),
            "--checkpoint",
            str(tmp_path / "cp"),
            "--once",
            *extra,
            password=password,
        )
    )


def test_archive_of_a_stream_nobody_serves(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/evt"
    assert _archive(url, tmp_path) == (
        f"error: CommError: cannot reach stream {url}: connection refused"
    )
    assert not (tmp_path / "cp").exists()


def test_archive_of_a_path_that_is_no_stream_a_wrong_password_or_component(
    tmp_path: Path,
) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db")
    with serving_in_thread(config) as server:
        wrong = server.url.replace("/evt", "/nowhere")
        assert _archive(wrong, tmp_path) == (
            f"error: InternalError: stream {wrong}: HTTP 404, not FTN3"
        )
        assert _archive(server.url, tmp_path, password="wrong") == (
            "error: SecurityError: Basic Auth Verification Failed"
        )
        line = _archive(server.url, tmp_path, "--component", "no-dash")
    assert line.startswith("error: component: String should match pattern")


def test_aggregate_names_the_source_whose_want_the_stream_does_not_carry(tmp_path: Path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db")
    with serving_in_thread(config) as server:
        source = {"url": server.url, "user": USER, "password_env": "TIDINGS_STREAM_PASSWORD"}
        path = tmp_path / "aggregate.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "sources": {
                        "good": source | {"component": "AGG"},
                        "typo": source | {"component": "AGG", "want": ["ORDER", "PAYY"]},
                    },
                    "destination": {"database": f"sqlite:///{tmp_path}/agg.db"},
                    "checkpoint_dir": str(tmp_path / "cp"),
                }
            )
        )
        line = _one_line(_tidings("aggregate", "-c", str(path), "--once"))
    assert line == (
        "error: source 'typo': InvalidRequest: want: stream 's' does not carry PAYY "
        "(it carries ORDER, PAY, AUDIT; null wants them all)"
    )
