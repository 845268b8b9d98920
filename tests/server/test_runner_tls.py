"""A deployment over TLS, started from the servers' own files: two servers serving
``ssl+sbs://`` Eventers and Syncers with mutual TLS, syncing with each other's client
certificates, a tidings client registering with its certificate, and the refusals counted
in the metrics."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.harness.processes import free_port, local_address
from tests.support.certificates import TlsSetup
from tests.support.waiting import run, until
from tidings.client import ConnectionClosed, QueryData, connect, json_event
from tidings.config.server import load_server_config_file
from tidings.server.runner import RunningServer

pytestmark = pytest.mark.sockets


def server_file(path: Path, server_id: int, ports: dict[str, int], peer: int | None) -> Path:
    """The server's file, its TLS files named relative to it (they are in ``pki/`` beside)."""
    server_tls = {
        "cert_file": "pki/tidings-test-server.crt",
        "key_file": "pki/tidings-test-server.key",
        "ca_file": "pki/tidings-test-ca.pem",
    }
    config: dict[str, Any] = {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": f"e{server_id}.db"},
        "engine": {"server_id": server_id},
        "eventer_server": {
            "address": local_address(ports["eventer"], "ssl+sbs"),
            "tls": server_tls,
        },
        "syncer_server": {"address": local_address(ports["syncer"], "ssl+sbs"), "tls": server_tls},
        "metrics": {"port": ports["metrics"]},
    }
    if peer is not None:
        config["syncer_client"] = {
            "tls": {
                "ca_file": "pki/tidings-test-ca.pem",
                "cert_file": f"pki/tidings-test-server-{server_id}.crt",
                "key_file": f"pki/tidings-test-server-{server_id}.key",
            }
        }
        config["syncer_peers"] = [
            {"server_id": 1, "address": local_address(peer, "ssl+sbs")},
        ]
    path.write_text(yaml.safe_dump(config))
    return path


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def test_a_pair_of_servers_and_a_client_over_mutual_tls(tmp_path: Path) -> None:
    setup = TlsSetup(tmp_path / "pki")
    setup.ca.client("server-2")
    client_tls = setup.client_tls("app")
    a_ports = {"eventer": free_port(), "syncer": free_port(), "metrics": free_port()}
    b_ports = {"eventer": free_port(), "syncer": free_port(), "metrics": free_port()}
    a = load_server_config_file(server_file(tmp_path / "a.yaml", 1, a_ports, None))
    b = load_server_config_file(server_file(tmp_path / "b.yaml", 2, b_ports, a_ports["syncer"]))

    async def main() -> None:
        server_a = await RunningServer.start(a)
        server_b = await RunningServer.start(b)
        try:
            address_a = local_address(a_ports["eventer"], "ssl+sbs")
            async with await connect(address_a, tls=client_tls) as client:
                [stored] = await client.register_with_response([json_event(("app", "x"), 1)])
                assert stored is not None
            address_b = local_address(b_ports["eventer"], "ssl+sbs")
            async with await connect(address_b, tls=client_tls) as client:

                async def arrived() -> bool:
                    found = await client.query(QueryData(event_types=(("app", "x"),)))
                    return [e.id for e in found] == [stored.id]

                while not await arrived():
                    await asyncio.sleep(0.05)
            # A client without a certificate is refused by both listeners, and counted.
            for port in (a_ports["eventer"], a_ports["syncer"]):
                without = await connect(
                    local_address(port, "ssl+sbs"), tls=setup.client_tls(), timeout=5
                )
                with pytest.raises(ConnectionClosed, match="client certificate"):
                    await without.query(QueryData(max_results=0))
                await without.aclose()
            await until(lambda: server_a.counters.refused_handshakes == 1)
            assert server_a.syncer is not None
            await until(
                lambda: server_a.syncer is not None and server_a.syncer.refused_handshakes == 1
            )
            metrics = await asyncio.to_thread(scrape, a_ports["metrics"])
            assert 'tidings_server_tls_handshakes_refused_total{listener="eventer"} 1.0' in metrics
            assert 'tidings_server_tls_handshakes_refused_total{listener="syncer"} 1.0' in metrics
        finally:
            await server_b.aclose()
            await server_a.aclose()

    run(main(), 60)
