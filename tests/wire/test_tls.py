"""Chatter over TLS (``ssl+sbs://``) on real sockets: verification by the client, mutual TLS,
refused handshakes, and the wrong scheme on either side. Every refusal is clean (an error
that says why on the client, one log line on the server) and the server goes on serving."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.support.certificates import TestCA, TlsSetup
from tests.support.server_helpers import warnings_of
from tests.support.waiting import run, until
from tidings.accept import SILENT_TLS
from tidings.config.tls import TlsClientConfig
from tidings.errors import ConfigError, ConnectionClosed, TlsError
from tidings.events.query import QueryData
from tidings.wire import chatter, chatter_client, chatter_server, codec

pytestmark = pytest.mark.sockets


class Served(list[chatter.Connection]):
    """The connections a test server served, and why it refused the others."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    @property
    def refused(self) -> int:
        return len(self.reasons)

    def refuse(self, reason: str) -> None:
        self.reasons.append(reason)


@asynccontextmanager
async def echo_server(
    tls: ssl.SSLContext | None, **options: float
) -> AsyncIterator[tuple[chatter_server.Server, Served]]:
    """A chatter server answering every MsgQueryReq with an empty MsgQueryRes; the
    connections it served are listed."""
    served = Served()

    async def handler(connection: chatter.Connection) -> None:
        served.append(connection)
        while True:
            message = await connection.receive()
            connection.send(codec.EVENTER, "MsgQueryRes", [], conversation=message.conversation)

    scheme = "tcp+sbs" if tls is None else "ssl+sbs"
    server = await chatter_server.listen(
        f"{scheme}://127.0.0.1:0", handler, tls=tls, on_refused=served.refuse, **options
    )
    try:
        yield server, served
    finally:
        await server.aclose()


async def ask(address: str, tls: TlsClientConfig | ssl.SSLContext | None = None) -> None:
    """Connect, make one request and close; raises what connecting or the request raised."""
    connection = await chatter_client.connect(address, tls=tls, ping_interval=None, timeout=5)
    try:
        query = codec.query_to_sbs(QueryData())
        reply = await connection.request(codec.EVENTER, "MsgQueryReq", query, timeout=5)
        assert (reply.module, reply.type) == (codec.EVENTER, "MsgQueryRes")
    finally:
        await connection.aclose()


def tls_address(server: chatter_server.Server, host: str = "127.0.0.1") -> str:
    return f"ssl+sbs://{host}:{server.port}"


def test_a_verified_client_talks_to_a_tls_server_and_has_no_identity_without_a_certificate(
    tmp_path: Path,
) -> None:
    setup = TlsSetup(tmp_path)

    async def main() -> None:
        async with echo_server(setup.server_tls().context()) as (server, served):
            await ask(tls_address(server), tls=setup.client_tls())
            # The certificate names both the IP address and localhost.
            await ask(tls_address(server, "localhost"), tls=setup.client_tls())
            assert [c.secure for c in served] == [True, True]
            assert [c.certificate_identity for c in served] == [None, None]

    run(main())


def test_mutual_tls_names_the_client_by_its_certificate(tmp_path: Path) -> None:
    setup = TlsSetup(tmp_path)

    async def main() -> None:
        async with echo_server(setup.server_tls(mutual=True).context()) as (server, served):
            await ask(tls_address(server), tls=setup.client_tls("relay-1"))
            assert [c.certificate_identity for c in served] == ["relay-1"]
            assert served.refused == 0

    run(main())


def test_mutual_tls_refuses_a_client_without_a_certificate_and_serves_the_next(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = TlsSetup(tmp_path)

    async def main() -> None:
        async with echo_server(setup.server_tls(mutual=True).context()) as (server, served):
            with pytest.raises(ConnectionClosed, match="may require a client certificate"):
                await ask(tls_address(server), tls=setup.client_tls())
            await until(lambda: served.refused == 1)
            await ask(tls_address(server), tls=setup.client_tls("next"))
            assert [c.certificate_identity for c in served] == ["next"]

    with caplog.at_level(logging.WARNING):
        run(main())
    [refusal] = [w for w in warnings_of(caplog) if w.startswith("TLS handshake")]
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in refusal


def test_mutual_tls_refuses_a_certificate_of_another_ca(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = TlsSetup(tmp_path)
    stranger = TestCA(tmp_path / "other", "stranger").client("intruder")

    async def main() -> None:
        async with echo_server(setup.server_tls(mutual=True).context()) as (server, served):
            tls = setup.client_tls(cert_file=str(stranger.cert), key_file=str(stranger.key))
            with pytest.raises((ConnectionClosed, TlsError)):
                await ask(tls_address(server), tls=tls)
            await until(lambda: served.refused == 1)
            assert served == []

    with caplog.at_level(logging.WARNING):
        run(main())
    [refusal] = [w for w in warnings_of(caplog) if w.startswith("TLS handshake")]
    assert "client certificate refused" in refusal


def test_the_client_refuses_a_server_certificate_not_from_its_ca(tmp_path: Path) -> None:
    setup = TlsSetup(tmp_path)
    other = TestCA(tmp_path / "other", "other")

    async def main() -> None:
        async with echo_server(setup.server_tls().context()) as (server, _):
            address = tls_address(server)
            for tls in (TlsClientConfig(ca_file=str(other.cert)), None):  # None: system CAs
                with pytest.raises(TlsError, match="server's certificate is refused"):
                    await ask(address, tls=tls)
            # Encrypting without verifying is possible, and said in the log.
            await ask(address, tls=TlsClientConfig(verify=False))

    run(main())


def test_the_client_refuses_a_certificate_for_another_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = TestCA(tmp_path)
    elsewhere = ca.server("elsewhere", ("events.example.org",))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(elsewhere.cert, elsewhere.key)

    async def main() -> None:
        async with echo_server(context) as (server, _):
            trusting = TlsClientConfig(ca_file=str(ca.cert))
            with pytest.raises(TlsError, match="mismatch"):
                await ask(tls_address(server), tls=trusting)
            named = TlsClientConfig(ca_file=str(ca.cert), server_name="events.example.org")
            await ask(tls_address(server), tls=named)
            # A ready context is taken as it is: it checks the address's host.
            with pytest.raises(TlsError, match="mismatch"):
                await ask(tls_address(server), tls=trusting.context())

    with caplog.at_level(logging.WARNING):
        run(main())


def test_plaintext_sent_to_a_tls_port_is_refused_and_tls_clients_are_served_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = TlsSetup(tmp_path)

    async def main() -> None:
        async with echo_server(setup.server_tls().context()) as (server, served):
            with pytest.raises((ConnectionClosed, ConnectionError)):
                await ask(f"tcp+sbs://127.0.0.1:{server.port}")
            await until(lambda: served.refused == 1)
            await ask(tls_address(server), tls=setup.client_tls())
            assert len(served) == 1

    with caplog.at_level(logging.WARNING):
        run(main())
    [refusal] = [w for w in warnings_of(caplog) if w.startswith("TLS handshake")]
    assert "plaintext sent to a TLS port" in refusal


def test_a_tls_client_at_a_plaintext_port_fails_clearly_and_plain_clients_are_served_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = TlsSetup(tmp_path)

    async def main() -> None:
        async with echo_server(None) as (server, served):
            with pytest.raises(TlsError, match="does the server serve ssl\\+sbs"):
                await ask(tls_address(server), tls=setup.client_tls())
            await ask(f"tcp+sbs://127.0.0.1:{server.port}")
            assert [c.secure for c in served] == [False, False]

    with caplog.at_level(logging.WARNING):
        run(main())
    assert any("the peer speaks TLS" in w for w in warnings_of(caplog))


def test_a_client_that_never_finishes_its_handshake_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = TlsSetup(tmp_path)

    async def main() -> None:
        context = setup.server_tls().context()
        async with echo_server(context, handshake_timeout=0.2) as (server, served):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            await until(lambda: served.refused == 1)
            assert await reader.read() == b""  # closed by the server
            writer.close()
            # One that starts its handshake and stalls has the same time for the rest.
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"\x16\x03\x01\x02\x00\x01")  # a ClientHello's first bytes
            await until(lambda: served.refused == 2)
            assert await reader.read() == b""
            writer.close()
            await ask(tls_address(server), tls=setup.client_tls())
            assert len(served) == 1
            assert served.reasons == [SILENT_TLS, chatter_server.TLS_HANDSHAKE]

    with caplog.at_level(logging.WARNING):
        run(main())
    warnings = warnings_of(caplog)
    assert any("no TLS handshake from 127.0.0.1 within 0.2 s" in w for w in warnings)
    assert any("no handshake within 0.2 s" in w for w in warnings)


def test_the_scheme_and_the_tls_settings_must_agree(tmp_path: Path) -> None:
    context = TlsSetup(tmp_path).server_tls().context()

    async def handler(connection: chatter.Connection) -> None:
        pass

    async def main() -> None:
        with pytest.raises(ConfigError, match="ssl\\+sbs address needs tls"):
            await chatter_server.listen("ssl+sbs://127.0.0.1:0", handler)
        with pytest.raises(ConfigError, match="must be ssl\\+sbs://"):
            await chatter_server.listen("tcp+sbs://127.0.0.1:0", handler, tls=context)

    run(main())
