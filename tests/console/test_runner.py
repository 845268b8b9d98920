"""``tidings console -c FILE`` as a process on a real socket: it serves, samples, refuses a
port in use at start-up, keeps the password out of its output and stops on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from bench.harness.processes import free_port, wait_for_port
from tests.console.harness import USERS, Deployment, hidden, serving
from tests.support.run_helpers import TIDINGS, Run, deployment
from tests.support.waiting import wait_until


def _file(tmp_path: Path, port: int) -> Path:
    data = {
        "database": {"url": "sqlite:///outbox.db"},
        "console": {"port": port, "users": USERS, "sample_every": "200ms"},
    }
    path = tmp_path / "tidings.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def test_the_console_serves_samples_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    path = _file(tmp_path, port)
    log = tmp_path / "console.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*TIDINGS, "console", "-c", str(path)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_until(lambda: _listening(port), 60, explain=log.read_text)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            form = client.get("/login")
            reply = client.post(
                "/login",
                data={"csrf": hidden(form.text, "csrf"), "user": "rita", "password": "read-secret"},
            )
            assert reply.status_code == 303
            wait_until(lambda: 'id="counts"' in client.get("/").text, 30)
        assert (tmp_path / "console-audit.sqlite").exists()  # beside the file
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log.read_text()
    output = log.read_text()
    assert "read-secret" not in output
    assert "console: login" in output


def test_a_port_in_use_stops_the_console_at_start_up(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = _file(tmp_path, port)
        done = subprocess.run(
            [*TIDINGS, "console", "-c", str(path)], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 2
    assert f"console: cannot listen on 127.0.0.1:{port}" in done.stderr


def _parts_shown(client: httpx.Client) -> dict[str, tuple[str, str]]:
    """The overview's parts table: name -> (state, restarts)."""
    page = client.get("/").text
    rows = re.findall(
        r'data-part="([^"]+)">.*?<td class="state">([^<]+)</td><td>([^<]+)</td>', page, re.S
    )
    return {name: (state, restarts) for name, state, restarts in rows}


@pytest.mark.sockets
def test_tidings_run_runs_the_console_which_sees_the_parts_and_a_server_restart(
    tmp_path: Path,
) -> None:
    console_port = free_port()
    section = {"port": console_port, "users": USERS, "sample_every": "200ms"}
    path, _ = deployment(tmp_path, console=section)
    data = yaml.safe_load(path.read_text())
    data["intermediaries"]["live"]["metrics"] = {"port": free_port()}
    path.write_text(yaml.safe_dump(data))
    run = Run(path)
    try:
        wait_for_port(console_port, 60, process=run.proc, log=run.log)
        wait_until(lambda: all(p["up"] for p in run.state()["parts"].values()), 60)
        with httpx.Client(base_url=f"http://127.0.0.1:{console_port}") as client:
            form = client.get("/login")
            client.post(
                "/login",
                data={"csrf": hidden(form.text, "csrf"), "user": "rita", "password": "read-secret"},
            )
            wait_until(lambda: _parts_shown(client).get("server.main") == ("up", "0"), 30)
            assert "the parts run under <code>tidings run</code>" in client.get("/").text
            shown = client.get("/intermediaries").text  # its own metrics endpoint, read
            assert 'data-intermediary="intermediary.live"' in shown
            assert "<code>subscribers</code></td><td>0</td>" in shown
            assert "problem" not in shown
            os.kill(run.part("server.main")["pid"], signal.SIGKILL)
            wait_until(  # back, and counted
                lambda: _parts_shown(client).get("server.main") == ("up", "1"),
                60,
                explain=run.output,
            )
        assert run.part("console")["restarts"] == 0
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(90) == 0, run.output()
    finally:
        run.close()
    assert any(line.startswith("[console] ") for line in run.output().splitlines())


@pytest.mark.anyio
async def test_over_tls_the_console_is_https_and_its_cookies_secure(
    tmp_path: Path, tls_files: dict[str, str]
) -> None:
    tls = {"cert_file": tls_files["server.pem"], "key_file": tls_files["server.key"]}
    deployed = Deployment(
        tmp_path, f"sqlite:///{tmp_path / 'outbox.db'}", port=free_port(), tls=tls
    )
    try:
        async with serving(deployed) as base:
            assert base.startswith("https://")
            async with httpx.AsyncClient(
                base_url=base, verify=ssl.create_default_context(cafile=tls_files["ca.pem"])
            ) as client:
                form = await client.get("/login")
                reply = await client.post(
                    "/login",
                    data={
                        "csrf": hidden(form.text, "csrf"),
                        "user": "rita",
                        "password": "read-secret",
                    },
                )
                assert reply.status_code == 303
                assert "secure" in reply.headers["set-cookie"].lower()
            async with httpx.AsyncClient(base_url=base.replace("https", "http")) as plain:
                with pytest.raises(httpx.HTTPError):
                    await plain.get("/login")
    finally:
        deployed.close()


@pytest.mark.anyio
async def test_the_consoles_port_bounds_connections_per_address_at_accept(
    tmp_path: Path,
) -> None:
    """The console's port is behind :mod:`tidings.accept` like every listener: with
    ``max_connections_per_address: 2``, a third connection from the same address is closed
    before a byte is read, while the two held ones are still served."""
    deployed = Deployment(
        tmp_path,
        f"sqlite:///{tmp_path / 'outbox.db'}",
        port=free_port(),
        max_connections_per_address=2,
    )
    try:
        async with serving(deployed) as base:
            limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
            first = httpx.AsyncClient(base_url=base, limits=limits)
            second = httpx.AsyncClient(base_url=base, limits=limits)
            third = httpx.AsyncClient(base_url=base, limits=limits)
            try:
                assert (await first.get("/login")).status_code == 200
                assert (await second.get("/login")).status_code == 200
                with pytest.raises(httpx.HTTPError):
                    await third.get("/login")
                assert (await first.get("/login")).status_code == 200  # kept alive, served
                await second.aclose()
                await wait_until_served(third)
            finally:
                for client in (first, second, third):
                    await client.aclose()
    finally:
        deployed.close()


async def wait_until_served(client: httpx.AsyncClient) -> None:
    """A seat given back is free again once the server has closed its socket (bounded)."""
    for _ in range(200):
        try:
            if (await client.get("/login")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError("the seat given back never became free")
