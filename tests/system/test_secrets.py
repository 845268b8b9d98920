"""No secret in any output of a whole deployment (issue 30, "Operational endpoints"): a
``tidings run`` of a file holding every kind of secret tidings configures, driven through
its normal work and its errors, then bad configurations through ``tidings config check`` and
the parts' own start-up; every line any of them wrote, and every file they left, is searched
for each secret.

The secrets: a stream user's password hash in the file and another's in a variable
(``password_hash_env``), the clear passwords consumers use, the servers' ``syncer_token``,
PostgreSQL URLs with passwords (the outbox and a server's store; the local server trusts
every connection, so any password works), and NATS URLs with passwords (one server reached,
one down, whose failures go into the outbox's rows and ``tidings events list``). A hash is
also searched for by its salt and digest alone. Real processes, real sockets, real Spark.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.harness.processes import free_port, local_address
from tests.support.helpers import delete_stream, stream_messages
from tests.support.pg_databases import PgDatabases
from tests.support.run_helpers import TIDINGS, Run
from tests.support.waiting import run as run_async
from tests.support.waiting import wait_until
from tidings.client import QueryData, connect
from tidings.config import OutboxConfig
from tidings.config.passwords import hash_password
from tidings.db import make_engine
from tidings.outbox.producer import Outbox

pytestmark = [
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.sockets,
    pytest.mark.postgres,
    pytest.mark.nats,
]

EVENTS = 6
WAIT = 240.0
#: A cheap scrypt cost: the test checks where hashes go, not how hard they are to break.
COST = 2**10


def _secret(name: str) -> str:
    return f"{name}-{secrets.token_hex(8)}"


class Secrets:
    """Every secret of the test, by name, and what is searched for in the outputs."""

    def __init__(self) -> None:
        self.stream_password = _secret("streampw")
        self.other_password = _secret("otherpw")
        self.stream_hash = hash_password(self.stream_password, n=COST)
        self.other_hash = hash_password(self.other_password, n=COST)
        self.syncer_token = _secret("syncertok")
        self.other_token = _secret("othertok")
        self.outbox_pg = _secret("outboxpg")
        self.store_pg = _secret("storepg")
        self.nats = _secret("natspw")
        self.nats_down = _secret("natsdownpw")

    def searched(self) -> dict[str, str]:
        """name -> text that must appear nowhere: each secret, and each hash's salt and
        digest alone (``scrypt$N$r$p$salt$digest``)."""
        found = {k: v for k, v in vars(self).items()}
        for name in ("stream_hash", "other_hash"):
            _, _, _, _, salt, digest = getattr(self, name).split("$")
            found[f"{name} salt"], found[f"{name} digest"] = salt, digest
        return found


@pytest.fixture
def databases(pg_databases: PgDatabases) -> Iterator[tuple[str, str]]:
    """Two empty PostgreSQL databases: the outbox's and server b's store."""
    names = (pg_databases.take(), pg_databases.take())
    try:
        yield names
    finally:
        for name in names:
            pg_databases.give_back(name)


class Outputs:
    """Everything the commands of the test printed, by what printed it."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}

    def command(
        self, what: str, *args: str, expect: int | None = None, timeout: float = 120, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """Run ``tidings ARGS`` (its output kept under ``what``); ``expect``: its exit code."""
        done = subprocess.run(
            [*TIDINGS, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **env},
        )
        self.texts[what] = f"{done.stdout}\n{done.stderr}"
        if expect is not None:
            assert done.returncode == expect, (what, done.returncode, self.texts[what])
        return done

    def leaks(self, searched: dict[str, str]) -> list[str]:
        return [
            f"{name} in the output of {what}: ...{_around(text, value)}..."
            for what, text in self.texts.items()
            for name, value in searched.items()
            if value in text
        ]


def _around(text: str, value: str) -> str:
    at = text.index(value)
    return text[max(0, at - 150) : at + len(value) + 50]


def _deployment(tmp_path: Path, s: Secrets, databases: tuple[str, str]) -> dict[str, Any]:
    ports = {name: free_port() for name in ("ea", "sa", "eb", "sb", "stream", "live", "dead")}
    tag = uuid.uuid4().hex[:10]
    return {
        "database": {"url": f"postgresql://postgres:{s.outbox_pg}@127.0.0.1:5432/{databases[0]}"},
        "outbox": {"originator": "shop"},
        "targets": {
            "main": {
                "kind": "event_server",
                "address": local_address(ports["ea"]),
                "type_prefix": ["shop"],
            },
            "bus": {
                "kind": "jetstream",
                "servers": [f"nats://tidings:{s.nats}@127.0.0.1:4222"],
                "stream": f"SECRETS_{tag}",
                "subject_prefix": f"secrets{tag}",
                "storage": "memory",
            },
            "down": {
                "kind": "jetstream",
                "servers": [f"nats://tidings:{s.nats_down}@127.0.0.1:{ports['dead']}"],
                "stream": f"DOWN_{tag}",
                "subject_prefix": f"down{tag}",
                "ack_timeout": "1s",
            },
        },
        "routing": {"routes": {"OrderPlaced": ["main", "bus"], "Broken": ["down"]}},
        "relay": {"checkpoint_dir": "checkpoint", "trigger_interval": "100ms"},
        "servers": {
            "a": {
                "backend": {"module": "tidings.server.backends.sqlite", "db_path": "a.db"},
                "engine": {"server_id": 1},
                "eventer_server": {"address": local_address(ports["ea"])},
                "syncer_server": {"address": local_address(ports["sa"])},
                "syncer_token": s.syncer_token,
                "syncer_peers": [
                    {
                        "server_id": 2,
                        "address": local_address(ports["sb"]),
                        "syncer_token": s.syncer_token,
                    }
                ],
                "stream_users": {
                    "app": {"password_hash": s.stream_hash},
                    "other": {"password_hash_env": "TIDINGS_OTHER_HASH"},
                },
                "streams": [
                    {
                        "name": "orders",
                        "port": ports["stream"],
                        "path": "/orders",
                        "types": {"ORDER": ["shop", "OrderPlaced"]},
                    }
                ],
            },
            "b": {
                "backend": {
                    "module": "tidings.server.backends.postgresql",
                    "url": f"postgresql://postgres:{s.store_pg}@127.0.0.1:5432/{databases[1]}",
                },
                "engine": {"server_id": 2},
                "eventer_server": {"address": local_address(ports["eb"])},
                "syncer_server": {"address": local_address(ports["sb"])},
                "syncer_token": s.syncer_token,
                "syncer_peers": [
                    {
                        "server_id": 1,
                        "address": local_address(ports["sa"]),
                        "syncer_token": s.syncer_token,
                    }
                ],
            },
        },
        "intermediaries": {
            "live": {
                "listen": f"127.0.0.1:{ports['live']}",
                "event_server": local_address(ports["ea"]),
            }
        },
    }


def _write(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


async def _stored(address: str, prefix: str) -> int:
    async with await connect(address) as client:
        return len(await client.query(QueryData(event_types=((prefix, "*"),))))


def test_no_secret_reaches_any_output_of_a_deployment_and_its_bad_configurations(
    tmp_path: Path, databases: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Secrets()
    monkeypatch.setenv("TIDINGS_OTHER_HASH", s.other_hash)
    data = _deployment(tmp_path, s, databases)
    path = _write(tmp_path / "tidings.yaml", data)
    server_a, bus = data["servers"]["a"], data["targets"]["bus"]
    stream_url = f"http://127.0.0.1:{server_a['streams'][0]['port']}/orders"
    out = Outputs()
    out.command("config check", "config", "check", "-c", str(path), expect=0)
    try:
        _run_the_deployment(tmp_path, path, data, s, stream_url, out)
    finally:
        delete_stream(bus["stream"])
    _bad_configurations(tmp_path, data, s, out)
    leaks = out.leaks(s.searched())
    leaks += _leaks_in_files(tmp_path, s.searched(), inputs={path, *tmp_path.glob("bad-*.yaml")})
    assert not leaks, "\n".join(leaks)


def _run_the_deployment(
    tmp_path: Path, path: Path, data: dict[str, Any], s: Secrets, stream_url: str, out: Outputs
) -> None:
    """``tidings run``, events through every part, and the errors a running deployment
    meets: a target down, wrong passwords, a malformed request; then its commands."""
    outbox = Outbox(make_engine(data["database"]["url"]), OutboxConfig(originator="shop"))
    run = Run(path)
    try:
        wait_until(lambda: run.part("relay")["up"], WAIT, explain=run.output)
        with outbox.transaction() as tx:
            for n in range(EVENTS):
                tx.emit("OrderPlaced", {"n": n}, partition_key="k")
            tx.emit("Broken", {"n": 0}, partition_key="b")
        for server in ("a", "b"):  # b through the Syncer, with the token
            address = data["servers"][server]["eventer_server"]["address"]
            wait_until(
                lambda a=address: run_async(_stored(a, "shop")) == EVENTS, WAIT, explain=run.output
            )
        assert len(stream_messages(data["targets"]["bus"]["stream"])) == EVENTS
        consumed = out.command(
            "consume",
            "consume",
            stream_url,
            "C1",
            "--count",
            str(EVENTS),
            expect=0,
            TIDINGS_STREAM_USER="app",
            TIDINGS_STREAM_PASSWORD=s.stream_password,
        )
        assert len(consumed.stdout.splitlines()) == EVENTS
        out.command(
            "consume with a wrong password",
            "consume",
            stream_url,
            "C2",
            "--connect-timeout",
            "5",
            expect=2,
            TIDINGS_STREAM_USER="app",
            TIDINGS_STREAM_PASSWORD=s.other_password,
        )
        run_async(_hostile_requests(stream_url, s))
        wait_until(lambda: "Broken" in _incomplete(out, path), WAIT, explain=run.output)
        out.command("status", "status", "-c", str(path), "--json", expect=0)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(180) == 0, run.output()
    finally:
        run.close()
        out.texts["tidings run"] = run.output()


def _incomplete(out: Outputs, path: Path) -> str:
    """``tidings events list``: the Broken event's reason names the target that is down."""
    return out.command("events list", "events", "list", "-c", str(path), expect=0).stdout


async def _hostile_requests(stream_url: str, s: Secrets) -> None:
    """What a stranger sends a running stream: wrong passwords (a real user's, the other
    user's hash as a password), a password where the user goes, a deep request."""
    async with httpx.AsyncClient() as client:
        for sec in (
            f"app:{s.other_password}",
            f"other:{s.stream_hash}",
            f"{s.stream_password}:x",
            f"other:{s.other_password}",  # right: registers nothing, but authenticates
        ):
            await client.post(
                stream_url,
                content=json.dumps(
                    {"f": "futoin.evt.poll:1.1:pollEvents", "p": {"component": "X"}, "sec": sec}
                ),
            )
        await client.post(stream_url, content=b"[" * 30_000 + b"]" * 30_000)


def _bad_configurations(tmp_path: Path, data: dict[str, Any], s: Secrets, out: Outputs) -> None:
    """Files ``config check`` refuses, and files that validate but whose parts cannot start
    (a database or a variable they need is not there): each through the command that
    meets it, logging at DEBUG."""
    a = data["servers"]["a"]
    dead = free_port()

    def variant(name: str, **changes: Any) -> Path:
        return _write(tmp_path / f"bad-{name}.yaml", {**data, **changes})

    def server_a(**changes: Any) -> dict[str, Any]:
        return {"servers": {**data["servers"], "a": {**a, **changes}}}

    refused = {
        "clear password": variant(
            "clear", **server_a(stream_users={"app": {"password": s.stream_password}})
        ),
        "misspelt key": variant(
            "misspelt", **server_a(stream_users={"app": {"pasword_hash": s.stream_hash}})
        ),
        "password as hash": variant(
            "as-hash", **server_a(stream_users={"app": {"password_hash": s.stream_password}})
        ),
        "tokens differ": variant(
            "tokens",
            **server_a(
                syncer_peers=[{**a["syncer_peers"][0], "syncer_token": s.other_token}],
            ),
        ),
        "unsupported database": variant(
            "oracle", database={"url": f"oracle://app:{s.outbox_pg}@db/app"}
        ),
        "malformed database url": variant(
            "malformed", database={"url": f"sqlite:/app:{s.outbox_pg}@x"}
        ),
        "no mapping": _write(tmp_path / "bad-list.yaml", [s.syncer_token, s.stream_hash]),
    }
    for what, bad in refused.items():
        out.command(f"config check: {what}", "config", "check", "-c", str(bad), expect=2)
        out.command(
            f"server start: {what}",
            "server",
            "-c",
            str(bad),
            "--name",
            "a",
            "--log-level",
            "DEBUG",
            expect=2,
        )
    unreachable = variant(
        "unreachable",
        database={"url": f"postgresql://postgres:{s.outbox_pg}@127.0.0.1:{dead}/x"},
        servers={
            **data["servers"],
            "b": {
                **data["servers"]["b"],
                "backend": {
                    "module": "tidings.server.backends.postgresql",
                    "url": f"postgresql://postgres:{s.store_pg}@127.0.0.1:{dead}/x",
                },
            },
        },
    )
    out.command("config check: unreachable", "config", "check", "-c", str(unreachable))
    out.command(
        "server b start: database unreachable",
        "server",
        "-c",
        str(unreachable),
        "--name",
        "b",
        "--log-level",
        "DEBUG",
        expect=2,
    )
    for command in (["status"], ["events", "list"], ["--log-level", "DEBUG", "relay", "--once"]):
        what = " ".join(command)
        out.command(f"{what}: database unreachable", *command, "-c", str(unreachable))
        assert "127.0.0.1" in out.texts[f"{what}: database unreachable"]  # it did fail there
    out.command(
        "server start: the hash variable holds a clear password",
        "server",
        "-c",
        str(tmp_path / "tidings.yaml"),
        "--name",
        "a",
        expect=2,
        TIDINGS_OTHER_HASH=s.other_password,
    )


def _leaks_in_files(root: Path, searched: dict[str, str], inputs: set[Path]) -> list[str]:
    """Secrets in any file the run left (logs, state, checkpoints, databases): the
    configuration files themselves aside, which hold them by design."""
    found = []
    for path in root.rglob("*"):
        if not path.is_file() or path in inputs:
            continue
        content = path.read_bytes()
        found += [
            f"{name} in {path.relative_to(root)}"
            for name, value in searched.items()
            if value.encode() in content
        ]
    return found
