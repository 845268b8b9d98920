"""Helpers shared by the test modules."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import nats
import yaml
from nats.js.api import RawStreamMsg, StreamInfo
from sqlalchemy import Engine, select

import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names
from tidings.config import TidingsConfig, load_config
from tidings.outbox.schema import outbox_event

SHARED_URL = "nats://127.0.0.1:4222"
NATS_SERVER = "/usr/sbin/nats-server"


def store_target(workdir: Path, **extra: object) -> dict:
    """An embedded event-store target in ``workdir`` with the type prefix ``t``."""
    return {
        "kind": "event_store",
        "url": f"sqlite:///{workdir / 'events.db'}",
        "type_prefix": ["t"],
        **extra,
    }


def relay_config(
    workdir: Path,
    database_url: str | None = None,
    *,
    targets: dict | None = None,
    routes: dict | None = None,
    **relay: object,
) -> TidingsConfig:
    """A configuration for a test: SQLite in ``workdir`` unless a URL is given."""
    return load_config(
        {
            "database": {"url": database_url or f"sqlite:///{workdir / 'app.db'}"},
            "targets": targets if targets is not None else {"store": store_target(workdir)},
            "routing": {"routes": routes if routes is not None else {"Created": ["store"]}},
            "relay": {"checkpoint_dir": str(workdir / "checkpoint"), "partitions": 2, **relay},
        }
    )


async def _admin(url: str, action: Callable[[Any], Any]) -> Any:
    nc = await nats.connect(
        url, allow_reconnect=False, max_reconnect_attempts=1, reconnect_time_wait=0
    )
    try:
        return await action(nc.jetstream())
    finally:
        await nc.close()


def admin(action: Callable[[Any], Any], url: str = SHARED_URL) -> Any:
    """Run one JetStream management call in a throwaway connection of its own."""
    return asyncio.run(_admin(url, action))


def stream_info(stream: str, url: str = SHARED_URL) -> StreamInfo:
    return admin(lambda js: js.stream_info(stream), url)


def stream_messages(stream: str, url: str = SHARED_URL) -> list[RawStreamMsg]:
    """Every message of ``stream`` in stream order."""

    async def read(js: Any) -> list[RawStreamMsg]:
        count = (await js.stream_info(stream)).state.messages
        return [await js.get_msg(stream, seq) for seq in range(1, count + 1)]

    return admin(read, url)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class PrivateServer:
    """A ``nats-server -js`` of the test's own, which may be started and killed at will."""

    def __init__(self, port: int, store: Path) -> None:
        self.port = port
        self.url = f"nats://127.0.0.1:{port}"
        self._store = store
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = ["-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self._store)]
        self._proc = subprocess.Popen(
            [NATS_SERVER, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_port(self.port)

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


def statuses(engine: Engine) -> dict[int, str]:
    """Status of every event-log row, by seq, in seq order."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(outbox_event.c.seq, outbox_event.c.status).order_by(outbox_event.c.seq)
        )
        return dict(rows.all())


def wait_until(predicate: Callable[[], bool], timeout: float = 90) -> None:
    """Poll ``predicate`` until true; fail the test if it is not within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


class ServerProcess:
    """A ``tidings server`` subprocess that can be killed and started again."""

    def __init__(
        self,
        workdir: Path,
        server_id: int,
        ports: dict[str, int],
        peers: Sequence[tuple[int, str]] = (),
        token: str | None = None,
        backend: dict[str, str] | None = None,
        eventer: dict[str, Any] | None = None,
    ) -> None:
        self.workdir = workdir
        self.eventer = f"tcp+sbs://127.0.0.1:{ports['eventer']}"
        self.port = ports["eventer"]
        self.config = workdir / "server.yaml"
        workdir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            yaml.safe_dump(
                {
                    "type": "event",
                    "backend": backend
                    or {"module": "tidings.server.backends.sqlite", "db_path": "ev.db"},
                    "engine": {"server_id": server_id, "modules": []},
                    "eventer_server": {"address": self.eventer, **(eventer or {})},
                    "syncer_server": {"address": f"tcp+sbs://127.0.0.1:{ports['syncer']}"},
                    "syncer_token": token,
                    "syncer_peers": [
                        {"server_id": peer_id, "address": address, "syncer_token": token}
                        for peer_id, address in peers
                    ],
                }
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.workdir / "server.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tidings.cli", "server", "--conf", str(self.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_port(self.port, timeout=30)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


#: A hat-event 0.8.5 server with the lmdb backend (its memory backend is broken in 0.8.5).
HAT_CONFIG = """\
type: event
log:
  version: 1
  formatters: {{f: {{format: "%(asctime)s %(levelname)s %(name)s %(message)s"}}}}
  handlers: {{c: {{class: logging.StreamHandler, formatter: f, level: WARNING}}}}
  root: {{level: WARNING, handlers: [c]}}
  disable_existing_loggers: false
backend:
  module: hat.event.server.backends.lmdb
  db_path: {db}
  max_db_size: 104857600
  flush_period: 1
  conditions: []
  latest: {{subscriptions: [['*']]}}
  ordered:
    - order_by: TIMESTAMP
      subscriptions: [['*']]
engine:
  server_id: {server_id}
  modules: []
eventer_server:
  address: tcp+sbs://127.0.0.1:{eventer_port}
syncer_server:
  address: tcp+sbs://127.0.0.1:{syncer_port}
"""


@contextlib.contextmanager
def hat_event_server(
    tmp_path: Path, server_id: int
) -> Iterator[tuple[int, int, subprocess.Popen[bytes]]]:
    """A real hat-event 0.8.5 server (lmdb backend): its eventer and syncer ports and process;
    terminated at the end if still running."""
    eventer_port, syncer_port = free_port(), free_port()
    conf = tmp_path / "hat-event.yaml"
    conf.write_text(
        HAT_CONFIG.format(
            db=tmp_path / "hat-event.db",
            server_id=server_id,
            eventer_port=eventer_port,
            syncer_port=syncer_port,
        )
    )
    executable = Path(sys.executable).with_name("hat-event-server")
    log_file = (tmp_path / "hat-event.log").open("wb")
    process = subprocess.Popen(
        [str(executable), "--conf", str(conf)], stdout=log_file, stderr=subprocess.STDOUT
    )
    try:
        wait_for_port(eventer_port, 20)
        wait_for_port(syncer_port, 20)
        yield eventer_port, syncer_port, process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()
