"""``tidings run``: the parts of one file as supervised child processes, for real: a server
with a stream and an intermediary on free ports (no relay here: no Spark), started in order,
restarted after a SIGKILL, stopped in order on SIGTERM; a part that cannot start is given up
on with one line; ``tidings status`` shows the parts; no part outlives a supervisor killed
hard; a second supervisor of the same file is refused. One test runs the relay too (Spark)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

import tidings.targets.registry  # noqa: F401 - enters the target kinds the example names
from bench.harness.processes import free_port, local_address, wait_for_port
from tests.support.run_helpers import TIDINGS, Run, deployment, gone
from tests.support.waiting import run as run_async
from tests.support.waiting import wait_until
from tidings import client
from tidings.config import OutboxConfig, load_config_file
from tidings.db import make_engine
from tidings.events.query import QueryData
from tidings.outbox.producer import Outbox
from tidings.system.parts import parts_of
from tidings.system.state import RunFiles, read_state

pytestmark = pytest.mark.sockets

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "system" / "tidings.yaml"


def _index(lines: list[str], text: str) -> int:
    """The index of the last line holding ``text``."""
    found = [i for i, line in enumerate(lines) if text in line]
    assert found, f"no line holds {text!r}:\n" + "\n".join(lines)
    return found[-1]


def test_the_example_deployment_has_its_parts_in_start_order() -> None:
    config = load_config_file(EXAMPLE)
    parts = parts_of(config, EXAMPLE)
    assert [p.name for p in parts] == ["server.main", "relay", "intermediary.live"]
    assert [p.stop_rank for p in parts] == [2, 1, 0]  # servers stop last, clients first
    assert parts[0].ready_on == ("127.0.0.1", 23012)
    assert parts[0].command[1:] == (
        "-m",
        "tidings.cli",
        "server",
        "-c",
        str(EXAMPLE),
        "--name",
        "main",
    )
    assert parts[2].ready_on == ("127.0.0.1", 8100)
    # both follow the server: restarted only while it is up
    assert parts[1].needs == parts[2].needs == ("server.main",)


def test_a_tier_is_one_part_run_with_its_name_and_up_once_its_last_member_listens() -> None:
    path = EXAMPLE.parent / "tier.yaml"
    (part,) = parts_of(load_config_file(path), path)
    assert (part.name, part.kind, part.needs) == ("tier.world", "intermediary", ())
    assert part.command[3:] == ("intermediary", "serve", "-c", str(path), "--tier", "world")
    assert part.ready_on == ("127.0.0.1", 8303)


def test_run_starts_restarts_reports_and_stops_the_parts_in_order(tmp_path: Path) -> None:
    path, ports = deployment(tmp_path)
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
        table = subprocess.run(
            [*TIDINGS, "status", "-c", str(path)], capture_output=True, text=True
        )
        assert table.returncode == 0, table.stderr
        assert "parts (supervisor running)" in table.stdout
        rows = [
            [cell for cell in line.split() if cell != "│"] for line in table.stdout.splitlines()
        ]
        assert ["server.main", "up"] in [row[:2] for row in rows], table.stdout
        server_pid = run.part("server.main")["pid"]
        intermediary_pid = run.part("intermediary.live")["pid"]
        os.kill(server_pid, signal.SIGKILL)  # a crash
        wait_until(
            lambda: run.part("server.main")["restarts"] == 1 and run.part("server.main")["up"],
            60,
            explain=run.output,
        )
        assert run.part("server.main")["pid"] != server_pid
        wait_for_port(ports["eventer"], 60, process=run.proc, log=run.log)
        assert "[supervisor] server.main exited with code -9; restart 1 in 0.5 s" in run.output()
        # the intermediary rides out its server's loss: it reconnects, it is not restarted
        wait_until(
            lambda: "intermediary chain: resynchronised" in run.output(), 60, explain=run.output
        )
        assert run.part("intermediary.live")["pid"] == intermediary_pid
        assert run.part("intermediary.live")["restarts"] == 0
        restart_logged = [
            json.loads(line)
            for line in run.output().splitlines()
            if line.startswith("{") and "part exited; restarting it" in line
        ]
        assert {k: restart_logged[0][k] for k in ("part", "exit_code", "restarts", "delay_s")} == {
            "part": "server.main",
            "exit_code": -9,
            "restarts": 1,
            "delay_s": 0.5,
        }
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(90) == 0, run.output()
    finally:
        run.close()
    lines = run.output().splitlines()
    assert any(line.startswith("[server.main] ") for line in lines)
    assert any(line.startswith("[intermediary.live] ") for line in lines)
    # clients stop before their server
    assert _index(lines, "intermediary stopped") < _index(lines, "event server 1 stopped")
    state = read_state(RunFiles.of(path))
    assert state is not None and not state["running"]
    assert {p["state"] for p in state["parts"].values()} == {"stopped"}
    assert not any(p["up"] for p in state["parts"].values())
    down = subprocess.run([*TIDINGS, "status", "-c", str(path), "--check"], capture_output=True)
    assert down.returncode == 1 and b"part server.main is down" in down.stdout


def test_a_part_that_cannot_start_is_given_up_on_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        path, _ = deployment(tmp_path, eventer=taken.getsockname()[1])
        run = Run(path)
        try:
            # its port is another's: the server is never up, and the intermediary never starts
            wait_until(lambda: run.part("server.main")["restarts"] >= 1, 60, explain=run.output)
            assert not run.part("server.main")["up"]
            assert run.proc.wait(120) == 2, run.output()
        finally:
            run.close()
    out = run.output()
    assert (
        "[supervisor] server.main exited 5 times in a row within 10 s of its start "
        "(last exit code 2): error: cannot start the server:"
    ) in out
    assert "address already in use; stopping the deployment" in out
    assert "[intermediary.live]" not in out
    state = read_state(RunFiles.of(path))
    assert state is not None and state["parts"]["server.main"]["state"] == "failed"


def test_no_part_outlives_a_supervisor_killed_hard_and_one_file_has_one_supervisor(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "state"
    path, ports = deployment(tmp_path)
    run = Run(path, "--run-dir", str(run_dir))
    try:
        wait_until(
            lambda: (
                (s := read_state(RunFiles.of(path, run_dir))) is not None
                and all(p["up"] for p in s["parts"].values())
            ),
            60,
            explain=run.output,
        )
        second = subprocess.run(
            [*TIDINGS, "run", "-c", str(path), "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2
        assert second.stderr.strip() == (
            f"error: tidings run is already running {path} (pid {run.proc.pid}, "
            f"lock {run_dir / 'run-tidings.lock'}); stop it first"
        )
        state = read_state(RunFiles.of(path, run_dir))
        assert state is not None
        pids = [part["pid"] for part in state["parts"].values()]
        run.proc.kill()  # SIGKILL: no chance to stop its parts
        run.proc.wait(30)
        wait_until(lambda: all(gone(pid) for pid in pids), 60)
        for port in ports.values():
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
        state = read_state(RunFiles.of(path, run_dir))
        assert state is not None and not state["running"]
        assert not (tmp_path / ".tidings").exists()  # the state went to --run-dir only
        # its lock went with it: the file runs again
        again = Run(path, "--run-dir", str(run_dir), log="again.log")
        try:
            wait_until(
                lambda: (
                    (s := read_state(RunFiles.of(path, run_dir))) is not None
                    and s["running"]
                    and all(p["up"] for p in s["parts"].values())
                ),
                60,
                explain=again.output,
            )
            again.proc.send_signal(signal.SIGINT)  # Ctrl-C
            assert again.proc.wait(60) == 0, again.output()
        finally:
            again.close()
    finally:
        run.close()


@pytest.mark.slow
def test_run_restarts_a_tier_killed_whole_and_its_subscribers_come_back(tmp_path: Path) -> None:
    """``tidings run`` with a tier: up once its members listen; the tier's own process
    SIGKILLed, its members end with it (they read its pipe), the supervisor starts the tier
    again on the same addresses, and a subscriber given the members' URLs is served again
    without subscribing anew; SIGTERM stops everything, no member left listening."""
    import asyncio

    import yaml

    from tests.support import waiting
    from tidings.intermediary.client.handover import ClusterClient

    feed, *ports = (free_port() for _ in range(3))
    path = tmp_path / "tidings.yaml"
    members = [f"127.0.0.1:{port}" for port in ports]
    spatial = {"upstream": f"ws://127.0.0.1:{feed}/", "world_lo": [0, 0], "world_hi": [100, 100]}
    path.write_text(
        yaml.safe_dump({"intermediary_tiers": {"world": {"members": members, "spatial": spatial}}})
    )
    publisher = subprocess.Popen(
        [*TIDINGS, "intermediary", "simulate", "--listen", f"127.0.0.1:{feed}", "--world", "100"],
        stdout=subprocess.DEVNULL,
    )
    run = None
    try:
        wait_for_port(feed, 60, process=publisher)
        run = Run(path)
        wait_until(lambda: run.part("tier.world")["up"], 90, explain=run.output)
        first = run.part("tier.world")["pid"]

        async def subscriber() -> None:
            urls = [f"ws://{member}/" for member in members]
            client = await ClusterClient.connect(urls)
            got: list[int] = []

            async def read() -> None:
                async for frame in client.frames():
                    got.append(frame.header.epoch)

            reader = asyncio.create_task(read())
            try:
                await client.subscribe("east", {"box": {"lo": [60, 0], "hi": [90, 90]}})
                await waiting.until(lambda: len(got) > 5, 60)
                os.kill(first, signal.SIGKILL)
                await waiting.until(
                    lambda: (p := run.part("tier.world"))["up"] and p["pid"] != first, 120
                )
                seen = len(got)
                await waiting.until(lambda: len(got) > seen + 5, 90)
                assert got == sorted(set(got))  # epochs increase across the restart
            finally:
                reader.cancel()
                await client.close()

        run_async(subscriber(), 300)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(60) == 0, run.output()
        for port in ports:
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        if run is not None:
            run.close()
        publisher.terminate()
        publisher.wait(30)


async def _stored(address: str) -> list[object]:
    """The data of the server's ``shop`` events (CloudEvents envelopes), in its order."""
    async with await client.connect(address) as connection:
        events = await connection.query(QueryData(event_types=(("shop", "*"),), order="ascending"))
        return [json.loads(e.payload or b"")["data"] for e in events]


@pytest.mark.slow
@pytest.mark.spark
def test_run_with_the_relay_delivers_and_stops_the_relay_before_its_server(
    tmp_path: Path,
) -> None:
    eventer = free_port()
    address = local_address(eventer)
    database = f"sqlite:///{tmp_path / 'shop.db'}"
    outbox = Outbox(make_engine(database), OutboxConfig(originator="shop"))
    with outbox.transaction() as tx:
        for n in range(5):
            tx.emit("OrderPlaced", {"n": n}, partition_key="k")
    path, _ = deployment(
        tmp_path,
        eventer=eventer,
        database={"url": database},
        outbox={"originator": "shop"},
        targets={"main": {"kind": "event_server", "address": address, "type_prefix": ["shop"]}},
        routing={"routes": {"OrderPlaced": ["main"]}},
        relay={"checkpoint_dir": "checkpoint", "trigger_interval": "100ms"},
    )
    run = Run(path)
    try:
        wait_until(lambda: run.part("relay")["up"], 120, explain=run.output)
        wait_until(lambda: len(run_async(_stored(address))) == 5, 240, explain=run.output)
        assert run_async(_stored(address)) == [{"n": n} for n in range(5)]
        status = subprocess.run(
            [*TIDINGS, "status", "-c", str(path), "--json"], capture_output=True, text=True
        )
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["parts"]["parts"]["relay"]["state"] == "up"
        assert report["parts"]["parts"]["relay"]["lag"] == "0 events"
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(180) == 0, run.output()
    finally:
        run.close()
    lines = run.output().splitlines()
    # the relay finished (its summary line) before its server stopped
    assert _index(lines, "[relay] relay stopped: ") < _index(lines, "event server 1 stopped")
    assert _index(lines, "intermediary stopped") < _index(lines, "[relay] relay stopped: ")
