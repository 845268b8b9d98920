"""The spatial feed over TLS (issue 30): a publisher serving ``wss://`` with mutual TLS (an
intermediary must present a certificate of the clients' CA), intermediaries verifying the
publisher's certificate, and every failed handshake (wrong CA, no client certificate,
plaintext) refused with the publisher serving the others on. Certificates are real
(openssl-made). No test asserts timings: waits are bounded only so that a broken build fails
instead of hanging."""

from __future__ import annotations

import ssl
from typing import Any

import numpy as np
import pytest

from tests.support.intermediary_helpers import WORLD
from tests.support.waiting import run, until
from tidings.config.intermediary import tls_connect_options
from tidings.config.tls import TlsClientConfig, TlsServerConfig
from tidings.errors import IntermediaryError
from tidings.intermediary.feed.remote import RemoteFeed
from tidings.intermediary.feed.resilient import ResilientFeed
from tidings.intermediary.publisher.server import SimulationServer
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.regions.geometry import Box

pytestmark = pytest.mark.sockets

WAIT = 60.0
HARBOUR = Box((10.0, 10.0), (60.0, 60.0))


def _mutual(files: dict[str, str]) -> ssl.SSLContext:
    settings = TlsServerConfig(
        cert_file=files["server.pem"], key_file=files["server.key"], ca_file=files["ca.pem"]
    )
    return settings.context()


def _client(files: dict[str, str], ca: str = "ca.pem", certificate: bool = True) -> dict[str, Any]:
    """The connection's TLS options, trusting ``ca``, with the client certificate or not."""
    mine = (
        {"cert_file": files["client.pem"], "key_file": files["client.key"]} if certificate else {}
    )
    return tls_connect_options("wss://", TlsClientConfig(ca_file=files[ca], **mine))


def test_a_feed_over_mutual_tls_serves_verified_intermediaries_and_refuses_the_rest(
    tls_files: dict[str, str],
) -> None:
    async def main() -> None:
        publisher = SimulationServer(Simulation(2_000, WORLD, seed=5), 20.0, _mutual(tls_files))
        url = await publisher.start()
        assert url.startswith("wss://")
        try:
            good = await RemoteFeed.connect(url, 2, tls=_client(tls_files))
            good.subscribe([HARBOUR])
            await until(lambda: any(len(b.ids) for b in good.take()), WAIT)

            refusals = [
                (_client(tls_files, "other-ca.pem"), "CERTIFICATE_VERIFY_FAILED"),
                ({}, "CERTIFICATE_VERIFY_FAILED"),  # the system's CAs do not know the test CA
            ]
            for options, reason in refusals:
                with pytest.raises(
                    IntermediaryError, match=f"feed: cannot connect to {url}: .*{reason}"
                ):
                    await RemoteFeed.connect(url, 2, tls=options)
            # No client certificate: the publisher ends the connection in its handshake (with
            # TLS 1.3 the client learns it reading the HTTP answer, which never comes).
            anonymous = _client(tls_files, certificate=False)
            with pytest.raises(IntermediaryError, match=f"feed: cannot connect to {url}: "):
                await RemoteFeed.connect(url, 2, tls=anonymous)
            with pytest.raises(IntermediaryError, match="feed: cannot connect to ws://"):
                await RemoteFeed.connect(url.replace("wss://", "ws://"), 2, open_timeout=WAIT)

            assert [c.feed for c in publisher.connections] == [publisher.connections[0].feed]
            before = publisher.connections[0].feed.batches
            await until(lambda: publisher.connections[0].feed.batches > before + 3, WAIT)
            assert good.closed_reason is None and good.take()
            await good.aclose()
        finally:
            await publisher.aclose()

    run(main(), WAIT)


def test_a_resilient_feed_reconnects_over_tls_with_its_options(tls_files: dict[str, str]) -> None:
    async def main() -> None:
        publisher = SimulationServer(Simulation(500, WORLD, seed=5), 20.0, _mutual(tls_files))
        url = await publisher.start()
        options = _client(tls_files)
        feed = await ResilientFeed.connect([url], 2, lambda: np.empty(0, np.int64), tls=options)
        try:
            feed.subscribe([HARBOUR])
            await until(lambda: bool(publisher.connections), WAIT)
            await publisher.connections[0].websocket.close(1001, "going away")

            def fresh_again() -> bool:
                feed.take()  # the new connection's first batch makes it fresh
                return feed.reconnects == 1 and feed.stale is None

            await until(fresh_again, WAIT)
        finally:
            await feed.aclose()
            await publisher.aclose()

    run(main(), WAIT)
