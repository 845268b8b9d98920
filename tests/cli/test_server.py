"""``tidings server`` as a user runs it: the shipped example, bad configurations, PostgreSQL."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from bench.harness.processes import (
    ServerProcess,
    free_port,
    local_address,
    tidings_cli,
    wait_for_port,
)
from tests.support.waiting import run
from tidings import client
from tidings.events.query import QueryData

pytestmark = pytest.mark.sockets

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "server.yaml"


def _server(args: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    """``tidings server ARGS`` in ``cwd``, its output kept for the test to read."""
    return tidings_cli("server", *args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


async def _round_trip(address: str) -> list[str]:
    async with await client.connect(address) as connection:
        [stored] = await connection.register_with_response(
            [client.json_event(("cli", "test"), {"n": 1})]
        )
        assert stored is not None
        events = await connection.query(QueryData(order="ascending"))
        return ["/".join(e.type) for e in events]


def test_the_example_runs_as_is_from_another_directory(tmp_path: Path) -> None:
    """The shipped file, copied unchanged: its SQLite file lands beside the configuration."""
    config_dir = tmp_path / "conf"
    config_dir.mkdir()
    shutil.copy(EXAMPLE, config_dir / "server.yaml")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    proc = _server(["--conf", str(config_dir / "server.yaml")], elsewhere)
    try:
        wait_for_port(23012, timeout=30, process=proc)
        wait_for_port(23013, timeout=30, process=proc)
        types = run(_round_trip(local_address(23012)))
        # The port probes above connected too: each connection has its eventer events.
        assert types[:2] == ["event/engine", "event/syncer/server"]
        assert set(types[2:-1]) == {"event/eventer"} and len(types) >= 4
        assert types[-1] == "cli/test"
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output.decode()
    assert (config_dir / "data" / "events.db").is_file()
    assert not (elsewhere / "data").exists()
    assert b"event server 1 stopped" in output


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("type: event\nengine: {server_id: 1, modules: []}\n", "backend: required key"),
        (
            "type: event\nbackend: {module: tidings.server.backends.sqlite, db_path: x.db}\n"
            "engine: {server_id: 1, modules: []}\nmonitor: {name: a}\n",
            "monitor.group: required key is missing",
        ),
        (
            "type: event\nbackend: {module: tidings.server.backends.sqlite, db_path: x.db}\n"
            "engine: {server_id: 1, modules: []}\n"
            f"eventer_server: {{address: '{local_address(free_port())}'}}\n"
            f"monitor: {{name: a, group: g, monitor_address: '{local_address(free_port())}'}}\n",
            "monitor: cannot connect to the Monitor Server at tcp+sbs://127.0.0.1:",
        ),
        (
            "type: event\nbackend: {module: no.such.backend}\n"
            "engine: {server_id: 1, modules: []}\n"
            f"eventer_server: {{address: '{local_address(free_port())}'}}\n",
            "cannot import 'no.such.backend'",
        ),
        (
            "type: event\nbackend: {module: tidings.server.backends.sqlite, db_path: x.db}\n"
            "engine: {server_id: 1, modules: [{module: no.such.module}]}\n"
            f"eventer_server: {{address: '{local_address(free_port())}'}}\n",
            "module 'no.such.module': cannot import it",
        ),
    ],
    # Named by what they test: the contents hold free ports, which differ between the
    # pytest-xdist workers that each collect the tests.
    ids=[
        "no-backend",
        "monitor-without-group",
        "monitor-away",
        "no-such-backend",
        "no-such-module",
    ],
)
def test_bad_configuration_exits_2_with_the_reason(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(content)
    proc = _server(["--conf", str(path)], tmp_path)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert expected in " ".join(output.decode().split())


def test_missing_default_configuration_names_the_place(tmp_path: Path) -> None:
    proc = tidings_cli(
        "server",
        cwd=tmp_path,
        env={"XDG_CONFIG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "pass --conf PATH" in " ".join(output.decode().split())


def test_address_in_use_is_a_clear_error(tmp_path: Path) -> None:
    first = ServerProcess.tidings(
        tmp_path / "a", 1, {"eventer": free_port(), "syncer": free_port()}
    )
    first.start()
    try:
        ports = {"eventer": first.port, "syncer": free_port()}
        second = ServerProcess.tidings(tmp_path / "b", 1, ports)
        proc = _server(["--conf", str(second.config)], tmp_path)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 2
        assert "cannot start the server" in output.decode()
    finally:
        first.stop()


@pytest.mark.postgres
def test_server_on_the_postgresql_backend(tmp_path: Path, pg_url: str) -> None:
    server = ServerProcess.tidings(
        tmp_path,
        7,
        {"eventer": free_port(), "syncer": free_port()},
        backend={"module": "tidings.server.backends.postgresql", "url": pg_url},
    )
    server.start()
    try:
        types = run(_round_trip(server.eventer))
    finally:
        server.stop()
    assert types[-1] == "cli/test"
    assert types[0] == "event/engine"
