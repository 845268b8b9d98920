"""The commands of a deployment's file, as a user types them: ``tidings server -c FILE --name``
and ``tidings intermediary serve -c FILE --name`` run one part alone; ``tidings run`` refuses
what it cannot run in one line and exit 2. (``tidings run`` itself: tests/system/test_run.py.)"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from bench.harness.processes import wait_for_port
from tests.support.cli_runs import one_error_line
from tests.support.run_helpers import TIDINGS, deployment
from tests.support.waiting import run
from tidings.errors import StreamError
from tidings.streams.client import StreamClient, StreamEvent

pytestmark = pytest.mark.sockets


def _one_line_exit_2(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert message in one_error_line(result)


async def _register(port: int, password: str) -> list[StreamEvent]:
    async with StreamClient(f"http://127.0.0.1:{port}/s", "app", password) as stream:
        await stream.register("c")
        return await stream.poll("c")


def test_a_server_of_the_file_runs_alone(tmp_path: Path) -> None:
    path, ports = deployment(tmp_path)
    server = subprocess.Popen(
        [*TIDINGS, "server", "-c", str(path), "--name", "main"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(ports["eventer"], 60, process=server)
        wait_for_port(ports["stream"], 60, process=server)
        # its stream, to the file's stream user, and only to it
        run(_register(ports["stream"], "pw"))
        with pytest.raises(StreamError):
            run(_register(ports["stream"], "wrong"))
        assert (tmp_path / "events.db").exists()  # relative to the file
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=30)
        assert server.returncode == 0, out
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["server", "--name", "nosuch"], "--name nosuch: no such server in"),
        (["intermediary", "serve", "--name", "nosuch"], "--name nosuch: no such intermediary"),
        (
            ["intermediary", "serve", "--tier", "nosuch"],
            "--tier nosuch: no such tier in",
        ),
        (
            ["intermediary", "serve", "--tier", "t", "--name", "live"],
            "--name and --tier: give one",
        ),
        (
            ["server", "--name", "main", "--conf", "server.yaml"],
            "give --conf FILE (a server's own file) or -c FILE --name NAME, not both",
        ),
    ],
)
def test_a_part_not_in_the_file_is_one_line_and_exit_2(
    tmp_path: Path, command: list[str], message: str
) -> None:
    path, _ = deployment(tmp_path)
    result = subprocess.run([*TIDINGS, *command, "-c", str(path)], capture_output=True, text=True)
    _one_line_exit_2(result, message)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["server", "--name", "main"], "--name main: names a server of a deployment's file"),
        (
            ["intermediary", "serve", "--name", "live"],
            "--name live: names an intermediary of a deployment's file",
        ),
        (
            ["intermediary", "serve", "--tier", "world"],
            "--tier world: names a tier of a deployment's file",
        ),
    ],
)
def test_a_name_without_a_file_is_one_line_and_exit_2(
    tmp_path: Path, command: list[str], message: str
) -> None:
    result = subprocess.run([*TIDINGS, *command], capture_output=True, text=True, cwd=tmp_path)
    _one_line_exit_2(result, f"error: {message}; give it with -c FILE")


def test_run_without_parts_refuses(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("outbox: {originator: x}\n")
    result = subprocess.run([*TIDINGS, "run", "-c", str(empty)], capture_output=True, text=True)
    _one_line_exit_2(result, "configures no part to run")


def test_run_refuses_a_run_directory_it_cannot_write(tmp_path: Path) -> None:
    path, _ = deployment(tmp_path)
    (tmp_path / "a-file").write_text("")
    run_dir = tmp_path / "a-file" / "run"
    result = subprocess.run(
        [*TIDINGS, "run", "-c", str(path)],
        capture_output=True,
        text=True,
        env={"TIDINGS_RUN_DIR": str(run_dir), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    _one_line_exit_2(result, f"error: run directory {run_dir}: cannot be written (Not a directory)")
    assert "choose another with --run-dir or $TIDINGS_RUN_DIR" in result.stderr
    assert not (tmp_path / "events.db").exists()  # nothing was started
