"""The two servers under test: ``tidings server`` with one stream, and FutoIn's own server
(``bench/futoin/server.js``), started again whenever it died."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.harness.processes import TIDINGS, ServerProcess, free_port, local_address, wait_for_port
from bench.streams.workload import EVENT_TYPE, FTN18_TYPE, FUTOIN_DIR, PASSWORD, SERVER_JS, USER
from tidings.config.passwords import hash_password


@dataclass(frozen=True)
class Endpoint:
    """How the FutoIn client reaches one server."""

    name: str
    push_url: str
    poll_url: str
    poll_version: str
    gen_url: str


def tidings_server(work: Path, url: str) -> tuple[ServerProcess, Endpoint]:
    """``tidings server`` on ``url`` (PostgreSQL, or a SQLite file: the embedded default)
    with one stream ``bench`` at ``/`` (not started)."""
    eventer, port = free_port(), free_port()
    backend = (
        {"module": "tidings.server.backends.sqlite", "db_path": url.removeprefix("sqlite:///")}
        if url.startswith("sqlite:///")
        else {"module": "tidings.server.backends.postgresql", "url": url}
    )
    config = {
        "type": "event",
        "backend": backend,
        "engine": {"server_id": 1},
        "eventer_server": {"address": local_address(eventer)},
        "stream_users": {USER: {"password_hash": hash_password(PASSWORD, n=2**10)}},
        "streams": [
            {
                "name": "bench",
                "port": port,
                "path": "/",
                "types": {FTN18_TYPE: list(EVENT_TYPE)},
                "secure_channel": True,
            }
        ],
    }
    server = ServerProcess(
        [*TIDINGS, "server"], work / f"tidings-{port}", config, {"eventer": eventer, "s": port}
    )
    base = f"127.0.0.1:{port}/"
    return server, Endpoint(
        "tidings", f"secure+ws://{base}", f"ws://{base}", "1.1", f"secure+ws://{base}"
    )


class FutoInServer:
    """FutoIn's own server (bench/futoin/server.js) on a PostgreSQL database; started again
    whenever it died (it exits when a consumer leaves with a push unanswered)."""

    def __init__(self, work: Path, db: str) -> None:
        self.port = free_port()
        self.db = db
        self.log = work / "futoin-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        base = f"127.0.0.1:{self.port}/"
        # Its poll is served only at 1.0 and only over WebSocket once push is served.
        self.endpoint = Endpoint(
            "futoin", f"secure+ws://{base}", f"ws://{base}", "1.0", f"secure+ws://{base}"
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def ensure(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        env = os.environ | {
            "DB_EVT_TYPE": "postgresql",
            "DB_EVT_HOST": "127.0.0.1",
            "DB_EVT_PORT": "5432",
            "DB_EVT_USER": "root",
            "DB_EVT_DB": self.db,
            "DB_EVT_MAXCONN": "1",
        }
        options = json.dumps({"port": self.port, "users": {USER: PASSWORD}})
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                ["node", str(SERVER_JS), options],
                cwd=FUTOIN_DIR,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.starts += 1
        wait_for_port(self.port, 30, process=self.proc, log=self.log)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def running(server: ServerProcess) -> Iterator[ServerProcess]:
    server.start(60)
    try:
        yield server
    finally:
        server.stop()
