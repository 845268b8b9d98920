"""``tidings intermediary serve`` with its ``metrics:`` and per-address ``limits:`` from the
file (issue 30), as an operator runs it: a real ``tidings server`` and the intermediary in
subprocesses, /metrics scraped over HTTP while real clients are refused and served."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.processes import ServerProcess, free_port, tidings_cli, wait_for_port
from tests.intermediary.serving.test_serve import _config, _serve, _stop, event_server
from tests.support.waiting import run
from tidings.config.passwords import hash_token, new_token
from tidings.errors import AccessRefused
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.serving.credentials import Credentials

pytestmark = pytest.mark.sockets

__all__ = ["event_server"]  # the fixture, shared with test_serve

TOKEN = new_token()


def test_serve_exports_its_metrics_and_throttles_an_address(
    tmp_path: Path, event_server: ServerProcess
) -> None:
    port, metrics_port = free_port(), free_port()
    section = {
        "listen": f"127.0.0.1:{port}",
        "event_server": event_server.eventer,
        "metrics": {"port": metrics_port},
        "limits": {"max_failed_logins": 2, "failed_login_block": "10m"},
        "anonymous": {"allowed_from": "nowhere"},
        "subscribers": {"dash": {"token_hash_env": "DASH_TOKEN_HASH", "events": [["*"]]}},
    }
    path = tmp_path / "tidings.yaml"
    path.write_text(yaml.safe_dump({"intermediary": section}))
    proc = tidings_cli(
        "intermediary", "serve", "-c", str(path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "DASH_TOKEN_HASH": hash_token(TOKEN)},
    )  # fmt: skip
    url = f"ws://127.0.0.1:{port}/"

    async def main() -> dict[str, float]:
        for _ in range(2):
            with pytest.raises(AccessRefused, match="not known"):
                await IntermediaryClient.connect(url, credentials=Credentials(token=new_token()))
        with pytest.raises(AccessRefused, match="too many failed logins") as throttled:
            await IntermediaryClient.connect(url, credentials=Credentials(token=TOKEN))
        assert throttled.value.status == 429
        other = Credentials(token=TOKEN)
        async with await IntermediaryClient.connect(
            url, credentials=other, local_addr=("127.0.0.2", 0)
        ) as dash:
            await dash.subscribe_events("all", [["app", "*"]])
            async with httpx.AsyncClient() as http:
                text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
        return {
            f"{s.name}{sorted(s.labels.items())}": s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    try:
        wait_for_port(port, 30, process=proc)
        wait_for_port(metrics_port, 30, process=proc)
        samples = run(main(), 60)
    finally:
        out, err = _stop(proc)
    reason = "tidings_intermediary_refusals_total[('reason', '{}')]"
    assert samples[reason.format("bad_credentials")] == 2
    assert samples[reason.format("login_throttled")] == 1
    assert samples["tidings_intermediary_subscribers[]"] == 1
    assert samples["tidings_intermediary_subscriptions[('kind', 'event')]"] == 1
    assert samples["tidings_intermediary_upstream_connected[('upstream', 'event_server')]"] == 1
    assert f"metrics at http://127.0.0.1:{metrics_port}/metrics" in out
    assert "Traceback" not in err and TOKEN not in out + err


def test_a_metrics_port_in_use_is_one_line_and_exit_2(
    tmp_path: Path, event_server: ServerProcess
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = _config(
            tmp_path,
            listen=f"127.0.0.1:{free_port()}",
            event_server=event_server.eventer,
            metrics={"port": port},
        )
        proc = _serve(config)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.decode().strip().splitlines() == [
        f"error: metrics: cannot serve on 127.0.0.1:{port}: Address already in use"
    ]
