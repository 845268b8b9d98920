"""A TLS stream's port under its accept limits (:mod:`tidings.accept`, uvicorn behind it), on
real sockets: a third connection from an address allowed two is closed at accept and counted
while a bystander is served; a client silent on the TLS port is closed at the (shortened)
handshake timeout and counted; one that starts a handshake and stalls is closed too (the
timeout given to asyncio, which uvicorn has no setting for); plaintext to the TLS port is
closed. Addresses 127.0.0.2 and 127.0.0.3 are loopback too (Linux routes 127/8 there)."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from pathlib import Path

import httpx
import pytest

from bench.harness.sockets import closed_within
from tests.support.certificates import TlsSetup
from tests.support.stream_helpers import serving, stream_server_config
from tests.support.waiting import run

pytestmark = pytest.mark.sockets

ATTACKER, SILENT = "127.0.0.2", "127.0.0.3"


def refusals(metrics: str, reason: str) -> float:
    found = re.search(
        rf'tidings_stream_refusals_total\{{[^}}]*reason="{reason}"[^}}]*\}} (\S+)', metrics
    )
    return 0.0 if found is None else float(found.group(1))


def test_a_tls_stream_port_bounds_each_address_and_closes_silent_clients(tmp_path: Path) -> None:
    tls = TlsSetup(tmp_path / "tls")
    config = stream_server_config(
        f"sqlite:///{tmp_path}/e.db",
        tls_certfile=str(tls.server.cert),
        tls_keyfile=str(tls.server.key),
        metrics=True,
        max_connections_per_address=2,
        tls_handshake_timeout="300ms",
    )
    client = ssl.create_default_context(cafile=str(tls.ca.cert))
    ping = json.dumps({"f": "futoin.ping:1.0:ping", "p": {"echo": 1}})

    async def scenario() -> None:
        async with serving(config) as server:
            port = server.config.streams[0].port
            url = server.url.replace("http://", "https://")
            # Two TLS connections from the attacker's address, held (idle after the handshake).
            held = [
                await asyncio.open_connection(
                    "127.0.0.1", port, ssl=client, local_addr=(ATTACKER, 0)
                )
                for _ in range(2)
            ]
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(ATTACKER, 0)
            )
            assert await closed_within(reader, 5)  # the third: closed at accept
            writer.close()
            # A client silent on the TLS port, one that stalls in its handshake, and plaintext.
            silent_reader, silent = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(SILENT, 0)
            )
            assert await closed_within(silent_reader, 10)
            silent.close()
            stalled_reader, stalled = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(SILENT, 0)
            )
            stalled.write(b"\x16\x03\x01\x02\x00\x01")  # a ClientHello's first bytes
            assert await closed_within(stalled_reader, 10)  # asyncio's own would be 60 s
            stalled.close()
            plain_reader, plain = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(SILENT, 0)
            )
            plain.write(b"POST /evt HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            assert await closed_within(plain_reader, 10)
            plain.close()
            # The bystander is served all along, and the refusals are counted.
            async with httpx.AsyncClient(verify=client) as http:
                reply = await http.post(url, content=ping)
                assert reply.json() == {"r": {"echo": 1}}
                metrics = (await http.get(server.metrics_url)).text
            assert refusals(metrics, "too_many_from_address") == 1.0
            assert refusals(metrics, "tls_handshake_timeout") == 1.0
            assert refusals(metrics, "not_tls") == 1.0
            for _, writer in held:
                writer.close()

    run(scenario())


def test_streams_sharing_a_port_must_give_it_the_same_accept_limits(tmp_path: Path) -> None:
    from tidings.config.streams import load_stream_server_config
    from tidings.errors import ConfigError

    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", max_connections_per_address=5)
    other = dict(config["streams"][0], name="t", path="/other")
    del other["max_connections_per_address"]
    config["streams"].append(other)
    with pytest.raises(
        ConfigError, match=r"streams s and t share 127\.0\.0\.1:\d+, so they must give the same"
    ):
        load_stream_server_config(config)
