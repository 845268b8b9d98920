"""Helpers shared by the test modules: relay configurations and what they produced (outbox
statuses, the event store's events, JetStream streams), and the real services the tests start
themselves (``tidings`` subprocesses, a private ``nats-server``, a hat-event 0.8.5 server)."""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import nats
import yaml
from nats.js.api import RawStreamMsg, StreamInfo
from nats.js.errors import NotFoundError
from sqlalchemy import Engine, select

import tidings.targets.registry
from tidings.config import TidingsConfig, load_config
from tidings.events.model import StoredEvent
from tidings.outbox.schema import outbox_event
from tidings.server.store import EventStore
from waiting import run, wait_for_port

SHARED_URL = "nats://127.0.0.1:4222"
NATS_SERVER = "/usr/sbin/nats-server"


# --- relay configurations and what the relay made of them ----------------------------------------


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


def write_config(config: TidingsConfig, path: Path) -> Path:
    """``config`` as the YAML file a ``--config`` option reads; returns ``path``."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


def statuses(engine: Engine) -> dict[int, str]:
    """Status of every event-log row, by seq, in seq order."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(outbox_event.c.seq, outbox_event.c.status).order_by(outbox_event.c.seq)
        )
        return dict(rows.all())


def store_events(config: TidingsConfig, target: str = "store") -> list[StoredEvent]:
    """Every event in the embedded event store of ``target``, in log order."""
    store = EventStore(config.targets[target].url)
    try:
        return store.read(0, 1_000_000)
    finally:
        store.close()


# --- JetStream on the shared server (or a private one, by url) -----------------------------------


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
    return run(_admin(url, action))


def stream_info(stream: str, url: str = SHARED_URL) -> StreamInfo:
    return admin(lambda js: js.stream_info(stream), url)


def stream_messages(stream: str, url: str = SHARED_URL) -> list[RawStreamMsg]:
    """Every message of ``stream`` in stream order."""

    async def read(js: Any) -> list[RawStreamMsg]:
        count = (await js.stream_info(stream)).state.messages
        return [await js.get_msg(stream, seq) for seq in range(1, count + 1)]

    return admin(read, url)


def delete_stream(stream: str, url: str = SHARED_URL) -> None:
    """Remove a stream a test made on the shared server, if it made one, so that runs do not
    pile them up."""
    with contextlib.suppress(NotFoundError):
        admin(lambda js: js.delete_stream(stream), url)


# --- processes: tidings as a user runs it, a private nats-server, hat-event 0.8.5 ----------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_address(port: int) -> str:
    """The event-server address (Eventer or Syncer) of ``port`` on the loopback."""
    return f"tcp+sbs://127.0.0.1:{port}"


def tidings_cli(*args: str, **popen: Any) -> subprocess.Popen[bytes]:
    """``tidings ARGS`` as a user runs it, in a subprocess of this interpreter; ``popen``
    goes to :class:`subprocess.Popen` (cwd, env, output)."""
    return subprocess.Popen([sys.executable, "-m", "tidings.cli", *args], **popen)


def kill_tree(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGKILL a process started with ``start_new_session=True`` and everything it started
    (the relay's JVM), as a crash would."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout)


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
        self.eventer = local_address(ports["eventer"])
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
                    "syncer_server": {"address": local_address(ports["syncer"])},
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
        self.proc = tidings_cli(
            "server",
            "--conf",
            str(self.config),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_port(self.port, timeout=30)

    def kill(self) -> None:
        assert self.proc is not None
        kill_tree(self.proc, 10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


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


def fresh_interpreter(program: str) -> str:
    """What ``program`` prints in a fresh interpreter (nothing of tidings imported yet),
    with this checkout's sources first on its path."""
    src = str(Path(tidings.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


#: The stacks the client, the event model and ``import tidings`` must not load.
HEAVY = ("sqlalchemy", "pyspark")


def heavy_modules_after(statement: str) -> dict[str, list[str]]:
    """The database and Spark modules (:data:`HEAVY`, the first few of each) a fresh
    interpreter holds after running ``statement``."""
    loaded = fresh_interpreter(
        f"{statement}\n"
        "import sys\n"
        f"print({{top: sorted(m for m in sys.modules if m.split('.')[0] == top)[:3]"
        f" for top in {HEAVY!r}}})\n"
    )
    return ast.literal_eval(loaded)
