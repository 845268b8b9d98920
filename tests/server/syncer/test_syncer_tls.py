"""The Syncer over TLS (``ssl+sbs://``): tidings peers with mutual TLS on top of the token,
a peer refused for its certificate, and interop with hat-event 0.8.5 both ways (its syncer
client syncing from us, and our client syncing from its server)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench.harness.processes import local_address
from tests.support.certificates import TestCA, TlsSetup
from tests.support.helpers import hat_event_server
from tests.support.server_helpers import async_engine, warnings_of
from tests.support.waiting import run, until
from tidings.client import json_event
from tidings.config.tls import TlsClientConfig
from tidings.server.async_engine import AsyncEngine
from tidings.server.syncer.client import SyncerClient
from tidings.server.syncer.server import SyncerServer

pytestmark = [pytest.mark.sockets, pytest.mark.timeout(120)]

TLS_LOCAL = "ssl+sbs://127.0.0.1:0"


def types_of(engine: AsyncEngine, server_id: int) -> list[tuple[str, ...]]:
    return [e.type for e in engine.store.read(0, 1_000_000) if e.id.server == server_id]


def test_peers_sync_over_mutual_tls_and_a_peer_without_our_certificate_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = TlsSetup(tmp_path)
    stranger = TestCA(tmp_path / "other", "stranger").client("server-9")

    async def main() -> None:
        async with (
            async_engine(tmp_path / "a.db", server_id=1) as a,
            async_engine(tmp_path / "b.db", server_id=2) as b,
            async_engine(tmp_path / "c.db", server_id=3) as c,
        ):
            await a.register([json_event(("a", str(i)), i) for i in range(3)])
            server = await SyncerServer.start(TLS_LOCAL, a, tls=setup.server_tls(mutual=True))
            address = f"ssl+sbs://127.0.0.1:{server.port}"
            good = SyncerClient(address, b, 1, min_delay=0.05, tls=setup.client_tls("server-2"))
            foreign = TlsClientConfig(
                ca_file=str(setup.ca.cert), cert_file=str(stranger.cert), key_file=str(stranger.key)
            )
            bad = SyncerClient(address, c, 1, min_delay=0.05, max_delay=0.2, tls=foreign)
            await good.start()
            await bad.start()
            try:
                await good.wait_synced(10)
                await until(lambda: ("a", "2") in types_of(b, 1))
                await a.register([json_event(("a", "live"), 1)])
                await until(lambda: ("a", "live") in types_of(b, 1))
                await until(lambda: server.clients == [("2", True)])
                # The refused peer keeps trying, stores nothing, and harms nobody.
                await until(lambda: server.refused_handshakes >= 2)
                assert types_of(c, 1) == []
                assert not bad.synced
            finally:
                await bad.aclose()
                await good.aclose()
                await server.aclose()

    with caplog.at_level(logging.WARNING):
        run(main(), 60)
    refusals = [w for w in warnings_of(caplog) if w.startswith("TLS handshake")]
    assert refusals and all("client certificate refused" in w for w in refusals)


def test_a_syncer_client_refuses_a_peer_whose_certificate_it_cannot_verify(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = TlsSetup(tmp_path)
    other = TestCA(tmp_path / "other", "other")

    async def main() -> None:
        async with (
            async_engine(tmp_path / "a.db", server_id=1) as a,
            async_engine(tmp_path / "b.db", server_id=2) as b,
        ):
            await a.register([json_event(("a",), 1)])
            server = await SyncerServer.start(TLS_LOCAL, a, tls=setup.server_tls())
            address = f"ssl+sbs://127.0.0.1:{server.port}"
            client = SyncerClient(
                address, b, 1, min_delay=0.05, tls=TlsClientConfig(ca_file=str(other.cert))
            )
            await client.start()
            try:
                await until(lambda: any("unreachable" in w for w in warnings_of(caplog)))
                assert types_of(b, 1) == []
            finally:
                await client.aclose()
                await server.aclose()

    with caplog.at_level(logging.WARNING):
        run(main(), 60)
    [unreachable] = [w for w in warnings_of(caplog) if "unreachable" in w]
    assert "server's certificate is refused" in unreachable


# --- interop with hat-event 0.8.5 -----------------------------------------------------------


def test_hat_event_syncer_client_syncs_from_our_tls_server(tmp_path: Path) -> None:
    """hat-event 0.8.5's syncer client connects over TLS as its server would (it verifies
    nothing and can present no certificate: hat-event gives it no ``pem_file``)."""
    import hat.event.common as hat_common
    import hat.event.syncer.client as hat_syncer_client

    setup = TlsSetup(tmp_path)

    async def main() -> None:
        async with async_engine(tmp_path / "a.db", server_id=1) as a:
            await a.register([json_event(("before",), {"i": 0})])
            server = await SyncerServer.start(TLS_LOCAL, a, tls=setup.server_tls())
            synced = asyncio.Event()
            got: list[Any] = []
            client = await hat_syncer_client.connect(
                f"ssl+sbs://127.0.0.1:{server.port}",
                "hat-probe",
                hat_common.EventId(1, 0, 0),
                synced_cb=synced.set,
                events_cb=got.extend,
            )
            try:
                await asyncio.wait_for(synced.wait(), 10)
                assert ("before",) in [tuple(e.event_type) for e in got]
                await a.register([json_event(("after",), {"x": 1})])
                await until(lambda: ("after",) in [tuple(e.event_type) for e in got])
                await until(lambda: server.clients == [("hat-probe", True)])
            finally:
                await server.aclose()
                await client.async_close()

    run(main(), 60)


def test_our_syncer_client_syncs_from_a_hat_event_server_over_tls(tmp_path: Path) -> None:
    """A real hat-event 0.8.5 server serving ``ssl+sbs://`` (with a certificate from our
    CA: see bench.harness.hat_tls_server), its Eventer used by its own client over TLS, and
    our Syncer client verifying it."""
    import hat.event.common as hat_common
    import hat.event.eventer as hat_eventer

    setup = TlsSetup(tmp_path)

    async def main(eventer_port: int, syncer_port: int, process: subprocess.Popen[bytes]) -> None:
        async with async_engine(tmp_path / "a.db", server_id=1) as a:
            eventer = await hat_eventer.connect(local_address(eventer_port, "ssl+sbs"))
            try:
                registered = await eventer.register_with_response(
                    [
                        hat_common.RegisterEvent(
                            event_type=("hat", str(i)),
                            source_timestamp=None,
                            payload=hat_common.EventPayload(
                                type=hat_common.EventPayloadType.JSON, data={"i": i}
                            ),
                        )
                        for i in range(3)
                    ]
                )
                assert all(registered)
                client = SyncerClient(
                    local_address(syncer_port, "ssl+sbs"),
                    a,
                    7,
                    min_delay=0.1,
                    tls=setup.client_tls(),
                )
                await client.start()
                try:
                    await client.wait_synced(15)
                    # lmdb flushes every second; its syncer serves flushed events only.
                    await until(
                        lambda: {("hat", "0"), ("hat", "1"), ("hat", "2")} <= set(types_of(a, 7)),
                        15,
                    )
                    eventer.register([hat_common.RegisterEvent(("hat", "live"), None, None)])
                    await until(lambda: ("hat", "live") in types_of(a, 7), 15)
                finally:
                    await client.aclose()
            finally:
                await eventer.async_close()

    with hat_event_server(tmp_path, 7, tls_pem=setup.server.pem) as (eventer, syncer, process):
        run(main(eventer, syncer, process), 60)
