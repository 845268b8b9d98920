"""Helpers shared by the test modules: relay configurations and what they produced (outbox
statuses, the event store's events, JetStream streams), a hat-event 0.8.5 server, fresh
interpreters, and the errors of a configuration file that cannot be read. The processes the
tests start (``tidings`` subprocesses and servers, a private ``nats-server``) are started as
the benchmarks start them, by ``bench.harness.processes``."""

from __future__ import annotations

import ast
import contextlib
import gc
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from nats.js.api import RawStreamMsg, StreamInfo
from nats.js.errors import NotFoundError
from sqlalchemy import Engine, select

import tidings.targets.registry
from bench.harness.processes import ServerProcess, free_port
from tests.support.waiting import run
from tidings.config import TidingsConfig, load_config
from tidings.errors import ConfigError
from tidings.events.model import StoredEvent
from tidings.outbox.schema import outbox_event
from tidings.server.store import EventStore

SHARED_URL = "nats://127.0.0.1:4222"
#: The checkout: a child process given it as PYTHONPATH imports the tests' modules.
REPO_ROOT = Path(__file__).resolve().parents[2]


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
    """A configuration for a test: SQLite in ``workdir`` unless a URL is given.

    Unless a test names its own ``retry``, the relay uses the patent's short schedule
    (10/25/40 ms): a poison is FAILED within one run, as the tests that are not about the
    retry policy expect (the default spans ~25 s;
    tests/pipeline/publishing/test_publisher.py pins it).
    """
    relay.setdefault("retry", {"backoff": ["10ms", "25ms", "40ms"]})
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


# --- processes: a hat-event 0.8.5 server (bench.harness.processes starts the others) -----


@contextlib.contextmanager
def hat_event_server(
    tmp_path: Path,
    server_id: int,
    tls_pem: Path | None = None,
    modules: list[dict[str, Any]] | None = None,
    syncer: bool = True,
) -> Iterator[tuple[int, int, subprocess.Popen[bytes]]]:
    """A real hat-event 0.8.5 server (lmdb backend) in ``tmp_path/hat-event``: its eventer and
    syncer ports and process; stopped at the end if still running. With ``tls_pem`` (its
    certificate and key) both serve ``ssl+sbs://``. ``modules``: its ``engine.modules``,
    which may name modules of the tests (``tests.support.hat_modules``); without ``syncer``
    it has no Syncer server (and no Syncer status events)."""
    ports = {"eventer": free_port(), **({"syncer": free_port()} if syncer else {})}
    server = ServerProcess.hat_event(
        tmp_path / "hat-event",
        server_id,
        ports,
        tls_pem=tls_pem,
        modules=modules,
        python_path=REPO_ROOT if modules else None,
    )
    server.start(20)
    try:
        assert server.proc is not None
        yield ports["eventer"], ports.get("syncer", 0), server.proc
    finally:
        server.stop(10)


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` with the garbage collector held off: on CPython 3.11 a collection that
    runs finalizers during the parse (the suite's earlier tests leave pending asyncio tasks
    behind) can fail it with "AST constructor recursion depth mismatch"."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=filename)
    finally:
        if enabled:
            gc.enable()


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


def assert_unreadable_files_fail(
    load: Callable[[Path], object], tmp_path: Path, *, missing: str, not_yaml: str
) -> None:
    """A configuration file ``load`` cannot use is a :class:`ConfigError` naming why: one
    that is not there (its message matching ``missing``), and one whose text ``not_yaml``
    is not YAML."""
    with pytest.raises(ConfigError, match=missing):
        load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text(not_yaml)
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(bad)
