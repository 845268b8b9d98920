"""``tidings run``: the parts of one file as supervised child processes, for real: a server
with a stream and an intermediary on free ports (no relay here: no Spark), started in order,
restarted after a SIGKILL, stopped in order on SIGTERM; a part that cannot start is given up
on with one line; ``tidings status`` shows the parts; each part runs alone from the file."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import tidings.targets.registry  # noqa: F401 - enters the target kinds the example names
from bench.harness.processes import free_port, wait_for_port
from tests.support.waiting import wait_until
from tidings.config import load_config_file
from tidings.config.passwords import hash_password
from tidings.system.parts import parts_of
from tidings.system.supervisor import read_state

pytestmark = pytest.mark.sockets

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "system" / "tidings.yaml"
TIDINGS = [sys.executable, "-m", "tidings.cli"]


def _deployment(tmp_path: Path, eventer: int | None = None) -> tuple[Path, dict[str, int]]:
    ports = {"eventer": eventer or free_port(), "stream": free_port(), "live": free_port()}
    address = f"tcp+sbs://127.0.0.1:{ports['eventer']}"
    data: dict[str, Any] = {
        "servers": {
            "main": {
                "backend": {"module": "tidings.server.backends.sqlite", "db_path": "events.db"},
                "engine": {"server_id": 1},
                "eventer_server": {"address": address},
                "stream_users": {"app": {"password_hash": hash_password("pw")}},
                "streams": [
                    {"name": "s", "port": ports["stream"], "path": "/s", "types": {"A": ["a"]}}
                ],
            }
        },
        "intermediaries": {
            "live": {"listen": f"127.0.0.1:{ports['live']}", "event_server": address}
        },
    }
    path = tmp_path / "tidings.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, ports


class Run:
    """``tidings run -c FILE`` in a subprocess, its output collected in a file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.log = path.parent / "run.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*TIDINGS, "run", "-c", str(path)], stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log.read_text()

    def state(self) -> dict[str, Any]:
        state = read_state(self.path)
        assert state is not None, self.output()
        return state

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def test_the_example_deployment_has_its_parts_in_start_order() -> None:
    config = load_config_file(EXAMPLE)
    parts = parts_of(config, EXAMPLE)
    assert [p.name for p in parts] == ["server.main", "relay", "intermediary.live"]
    assert [p.stop_rank for p in parts] == [2, 1, 0]  # servers stop last, clients first
    assert parts[0].ready_on == ("127.0.0.1", 23012)
    assert parts[0].arguments == ("server", "-c", str(EXAMPLE), "--name", "main")


def test_run_starts_restarts_reports_and_stops_the_parts_in_order(tmp_path: Path) -> None:
    path, ports = _deployment(tmp_path)
    run = Run(path)
    try:
        for port in ports.values():
            wait_for_port(port, 60, process=run.proc, log=run.log)
        wait_until(lambda: all(p["up"] for p in run.state()["parts"].values()), 30)
        status = subprocess.run(
            [*TIDINGS, "status", "-c", str(path), "--json"], capture_output=True, text=True
        )
        assert status.returncode == 0, status.stderr
        parts = json.loads(status.stdout)["parts"]["parts"]
        assert {name: part["state"] for name, part in parts.items()} == {
            "server.main": "up",
            "intermediary.live": "up",
        }
        assert parts["server.main"]["lag"] == "no consumers"  # its stream has none yet
        server_pid = run.state()["parts"]["server.main"]["pid"]
        os.kill(server_pid, signal.SIGKILL)  # a crash
        wait_until(
            lambda: (
                run.state()["parts"]["server.main"]["restarts"] == 1
                and run.state()["parts"]["server.main"]["up"]
            ),
            60,
            explain=run.output,
        )
        assert run.state()["parts"]["server.main"]["pid"] != server_pid
        wait_for_port(ports["eventer"], 60, process=run.proc, log=run.log)
        assert "[supervisor] server.main exited with code -9; restart 1" in run.output()
        # the intermediary lost its server and exits 2: restarted too, and serving again
        wait_until(lambda: run.state()["parts"]["intermediary.live"]["up"], 60)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(90) == 0, run.output()
    finally:
        run.close()
    out = run.output()
    lines = out.splitlines()
    assert any(line.startswith("[server.main] ") for line in lines)
    assert any(line.startswith("[intermediary.live] ") for line in lines)
    stopped_intermediary = max(i for i, x in enumerate(lines) if "intermediary stopped" in x)
    stopped_server = max(i for i, x in enumerate(lines) if "event server 1 stopped" in x)
    assert stopped_intermediary < stopped_server  # clients stop before their server
    state = read_state(path)
    assert state is not None and not state["running"]
    assert not any(p["up"] for p in state["parts"].values())
    down = subprocess.run([*TIDINGS, "status", "-c", str(path), "--check"], capture_output=True)
    assert down.returncode == 1 and b"part server.main is down" in down.stdout


def test_a_part_that_cannot_start_is_given_up_on_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        path, _ = _deployment(tmp_path, eventer=taken.getsockname()[1])
        run = Run(path)
        try:
            assert run.proc.wait(120) == 2, run.output()
        finally:
            run.close()
    out = run.output()
    assert "[supervisor] server.main exited 5 times in a row within 10 s of its start" in out
    assert "stopping the deployment" in out


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["server", "--name", "nosuch"], "--name nosuch: no such server in"),
        (["intermediary", "serve", "--name", "nosuch"], "--name nosuch: no such intermediary"),
    ],
)
def test_a_part_not_in_the_file_is_one_line_and_exit_2(
    tmp_path: Path, command: list[str], message: str
) -> None:
    path, _ = _deployment(tmp_path)
    result = subprocess.run([*TIDINGS, *command, "-c", str(path)], capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_run_without_a_file_or_parts_refuses(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("outbox: {originator: x}\n")
    result = subprocess.run([*TIDINGS, "run", "-c", str(empty)], capture_output=True, text=True)
    assert result.returncode == 2 and "configures no part to run" in result.stderr
