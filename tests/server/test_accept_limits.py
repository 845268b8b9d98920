"""The Eventer's and the Syncer's TLS ports under their accept limits (:mod:`tidings.accept`),
started from a server's file, on real sockets: a client silent on the Eventer's TLS port is
closed at the (shortened) handshake timeout and counted, a third connection from an address
the Syncer allows two is closed at accept and counted, and a bystander client registers
and queries meanwhile. 127.0.0.2 is loopback too (Linux routes 127/8 there)."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest

from bench.harness.processes import free_port, local_address
from bench.harness.sockets import closed_within
from tests.support.certificates import TlsSetup
from tests.support.waiting import run, until
from tidings.client import QueryData, connect, json_event
from tidings.config.server import load_server_config
from tidings.server.runner import RunningServer

pytestmark = pytest.mark.sockets

ATTACKER = "127.0.0.2"


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def test_eventer_and_syncer_ports_close_silent_clients_and_bound_each_address(
    tmp_path: Path,
) -> None:
    setup = TlsSetup(tmp_path / "pki")
    server_tls = {"cert_file": str(setup.server.cert), "key_file": str(setup.server.key)}
    ports = {"eventer": free_port(), "syncer": free_port(), "metrics": free_port()}
    config = load_server_config(
        {
            "type": "event",
            "backend": {
                "module": "tidings.server.backends.sqlite",
                "db_path": str(tmp_path / "e.db"),
            },
            "engine": {"server_id": 1},
            "eventer_server": {
                "address": local_address(ports["eventer"], "ssl+sbs"),
                "tls": server_tls,
                "tls_handshake_timeout": "300ms",
            },
            "syncer_server": {
                "address": local_address(ports["syncer"], "ssl+sbs"),
                "tls": server_tls,
                "max_connections_per_address": 2,
            },
            "metrics": {"port": ports["metrics"]},
        }
    )

    async def main() -> None:
        server = await RunningServer.start(config)
        try:
            address = local_address(ports["eventer"], "ssl+sbs")
            async with await connect(address, tls=setup.client_tls()) as bystander:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", ports["eventer"], local_addr=(ATTACKER, 0)
                )
                assert await closed_within(reader, 10)
                writer.close()
                held = [
                    await asyncio.open_connection(
                        "127.0.0.1", ports["syncer"], local_addr=(ATTACKER, 0)
                    )
                    for _ in range(2)
                ]
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", ports["syncer"], local_addr=(ATTACKER, 0)
                )
                assert await closed_within(reader, 5)
                writer.close()
                [stored] = await bystander.register_with_response([json_event(("app", "x"), 1)])
                assert stored is not None
                found = await bystander.query(QueryData(event_types=(("app", "x"),)))
                assert [e.id for e in found] == [stored.id]
                for _, held_writer in held:
                    held_writer.close()
            await until(lambda: server.counters.refused_handshakes == 1)
            metrics = await asyncio.to_thread(scrape, ports["metrics"])
            assert 'tidings_server_tls_handshakes_refused_total{listener="eventer"} 1.0' in metrics
            assert (
                'tidings_server_connections_refused_total{listener="syncer",'
                'reason="too_many_from_address"} 1.0'
            ) in metrics
        finally:
            await server.aclose()

    run(main(), 60)
