"""A small whole deployment in one ``tidings.yaml`` and ``tidings run`` on it, for the tests
of the supervisor (tests/system) and of its commands (tests/cli): an event server with a
stream and an intermediary following it, on free ports, SQLite only (no Spark, no NATS)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import yaml

from bench.harness.processes import free_port
from tests.support.waiting import wait_until
from tidings.config.passwords import hash_password
from tidings.system.state import RunFiles, read_state

TIDINGS = [sys.executable, "-m", "tidings.cli"]


def deployment(
    tmp_path: Path, eventer: int | None = None, **sections: Any
) -> tuple[Path, dict[str, int]]:
    """Write the deployment's file in ``tmp_path`` (``sections`` added to it); its path and
    ports (``eventer``, ``stream``, ``live``: the intermediary's)."""
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
        **sections,
    }
    path = tmp_path / "tidings.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, ports


class Run:
    """``tidings run -c FILE [ARGS]`` in a subprocess, its output collected in a file."""

    def __init__(self, path: Path, *args: str, log: str = "run.log") -> None:
        self.path = path
        self.log = path.parent / log
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*TIDINGS, "run", "-c", str(path), *args], stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log.read_text()

    def state(self) -> dict[str, Any]:
        """The supervisor's state (waited for: it writes it once it has read the file)."""
        files = RunFiles.of(self.path)
        wait_until(lambda: read_state(files) is not None, 60, explain=self.output)
        state = read_state(files)
        assert state is not None
        return state

    def part(self, name: str) -> dict[str, Any]:
        part: dict[str, Any] = self.state()["parts"][name]
        return part

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie not yet reaped by whoever adopted it has)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
