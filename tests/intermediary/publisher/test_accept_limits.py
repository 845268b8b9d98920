"""The spatial feed's TLS port under its accept limits (:mod:`tidings.accept`, websockets
behind it), on real sockets: a client silent on the TLS port is closed at the (shortened)
handshake timeout, a second connection from an address allowed one is closed at accept, each
counted in the publisher's refusals, and an intermediary from another address is fed
meanwhile. 127.0.0.2 is loopback too (Linux routes 127/8 there)."""

from __future__ import annotations

import asyncio

import pytest

from bench.harness.sockets import closed_within
from tests.support.intermediary_helpers import WORLD
from tests.support.waiting import run, until
from tidings.accept import SILENT_TLS, TOO_MANY_FROM_ADDRESS
from tidings.config.intermediary import tls_connect_options
from tidings.config.tls import TlsClientConfig, TlsServerConfig
from tidings.intermediary.feed.remote import RemoteFeed
from tidings.intermediary.publisher.server import SimulationServer
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.regions.geometry import Box

pytestmark = pytest.mark.sockets

WAIT = 60.0
ATTACKER = "127.0.0.2"


def test_the_feed_closes_silent_clients_and_bounds_each_address(
    tls_files: dict[str, str],
) -> None:
    server_tls = TlsServerConfig(
        cert_file=tls_files["server.pem"], key_file=tls_files["server.key"]
    )
    trusting = TlsClientConfig(ca_file=tls_files["ca.pem"])

    async def main() -> None:
        publisher = SimulationServer(
            Simulation(500, WORLD, seed=5),
            20.0,
            server_tls.context(),
            max_connections_per_address=1,
            tls_handshake_timeout=0.3,
        )
        url = await publisher.start()
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", publisher.port, local_addr=(ATTACKER, 0)
            )
            assert await closed_within(reader, 10)
            writer.close()
            _, held = await asyncio.open_connection(
                "127.0.0.1", publisher.port, ssl=trusting.context(), local_addr=(ATTACKER, 0)
            )
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", publisher.port, local_addr=(ATTACKER, 0)
            )
            assert await closed_within(reader, 5)
            writer.close()
            feed = await RemoteFeed.connect(url, 2, tls=tls_connect_options(url, trusting))
            feed.subscribe([Box((10.0, 10.0), (60.0, 60.0))])
            await until(lambda: any(len(b.ids) for b in feed.take()), WAIT)
            await feed.aclose()
            held.close()
            assert publisher.refusals == {SILENT_TLS: 1, TOO_MANY_FROM_ADDRESS: 1}
        finally:
            await publisher.aclose()

    run(main(), WAIT)
