"""examples/system/hardened.yaml, as its comments tell a user to run it: the certificates made
with ``tidings tls init``, the secrets' hashes in the environment, ``tidings config check``,
then ``tidings run`` (the relay on Spark included).

What it proves, on the example itself (only its ports moved to free ones, so that it runs
beside other tests): one event goes from the outbox through the relay, the event server, its
stream and the intermediary, over verified TLS at every hop, to clients that authenticate;
the stream's data filter holds another tenant's event back; and at each edge a client can
reach (the Eventer, the Syncer, the stream, the intermediary), plaintext, a client without
credentials and a client asking for more than it was granted are refused."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidHandshake

import tidings.targets.registry  # noqa: F401 - enters the target kinds the example names
from bench.harness.processes import free_port
from tests.support.certificates import TestCA
from tests.support.cli_runs import run_tidings
from tests.support.run_helpers import Run
from tests.support.waiting import wait_until
from tidings import client
from tidings.config import OutboxConfig, load_config_file
from tidings.config.passwords import hash_password, hash_token, new_token
from tidings.config.tls import TlsClientConfig
from tidings.db import make_engine
from tidings.errors import AccessRefused, ConnectionClosed, StreamError, SubscriptionRefused
from tidings.events.query import QueryData
from tidings.intermediary.client import Credentials, IntermediaryClient
from tidings.intermediary.views.rows import emit_row
from tidings.outbox.producer import Outbox
from tidings.streams.client import StreamClient
from tidings.system.checks import system_findings

pytestmark = pytest.mark.sockets

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "system" / "hardened.yaml"
#: The example's ports: Eventer, Syncer, stream, intermediary, relay's and server's metrics.
PORTS = ("23012", "23013", "8090", "8100", "9464", "9465")
BILLING, OPS = "billing-secret-pw", "ops-secret-pw"


class Deployment:
    """The example copied into a directory with free ports, its certificates made with the
    CLI, and the environment its secrets come from."""

    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ports = {port: free_port() for port in PORTS}
        text = EXAMPLE.read_text()
        for old, new in self.ports.items():
            text = re.sub(rf"(?<=[: ]){old}\b", str(new), text)
        self.path = directory / "hardened.yaml"
        self.path.write_text(text)
        self.tls = directory / "tls"
        self.token = new_token()
        for name, value in {
            "SHOP_BILLING_HASH": hash_password(BILLING),
            "SHOP_OPS_HASH": hash_password(OPS),
            "SHOP_DASHBOARD_TOKEN_HASH": hash_token(self.token),
        }.items():
            monkeypatch.setenv(name, value)

    def make_certificates(self) -> None:
        """The one command the example's comments give."""
        made = run_tidings(
            "tls", "init", str(self.tls), "--host", "127.0.0.1", "--host", "localhost",
            "--client", "relay", "--client", "live",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        peers = run_tidings(
            "tls", "init", str(self.tls / "peers"), "--host", "127.0.0.1", "--host", "localhost"
        )
        assert peers.returncode == 0, peers.stderr

    def port(self, example_port: str) -> int:
        return self.ports[example_port]

    def client_tls(self, cert: str | None = None, ca: Path | None = None) -> ssl.SSLContext:
        """Trusting the example's CA (or ``ca``); with ``cert``, presenting that certificate."""
        return TlsClientConfig(
            ca_file=str(ca or self.tls / "ca.pem"),
            cert_file=None if cert is None else str(cert),
        ).context()


def test_the_hardened_example_checks_once_its_certificates_are_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = Deployment(tmp_path, monkeypatch)
    missing = run_tidings("config", "check", "-c", str(deployment.path))
    assert missing.returncode == 2
    assert "tls/ca.pem' does not exist" in missing.stderr  # names the file to make
    deployment.make_certificates()
    checked = run_tidings("config", "check", "-c", str(deployment.path))
    assert checked.returncode == 0, checked.stderr
    config = load_config_file(deployment.path)
    assert system_findings(config) == []
    # every listener is TLS, no one is served anonymously, metrics stay on this host
    server = config.servers["main"]
    assert server.eventer_server.address.startswith("ssl+sbs://")
    assert server.eventer_server.tls is not None and server.eventer_server.tls.mutual
    assert server.syncer_server is not None and server.syncer_server.tls is not None
    assert server.syncer_server.tls.mutual
    assert server.eventer_server.anonymous.allowed_from == "nowhere"
    assert all(stream.endpoint.startswith("https://") for stream in server.streams)
    assert server.stream_allow_required
    live = config.intermediaries["live"]
    assert live.tls is not None and live.anonymous.allowed_from == "nowhere"
    assert server.metrics is not None and server.metrics.address == "127.0.0.1"
    assert config.metrics.address == "127.0.0.1"
    # the secrets are the environment's hashes: none is in the file
    for secret in (BILLING, OPS, deployment.token):
        assert secret not in deployment.path.read_text()


async def _refused_at_the_eventer(d: Deployment) -> None:
    """A plaintext client, a client without a certificate, one of another CA, and one whose
    certificate names no identity of the server are all refused; ``live`` reads."""
    port = d.port("23012")
    plain = f"tcp+sbs://127.0.0.1:{port}"
    address = f"ssl+sbs://127.0.0.1:{port}"
    every = QueryData(event_types=(("*",),))
    with pytest.raises((ConnectionClosed, OSError, TimeoutError)):
        async with await client.connect(plain, timeout=5, request_timeout=5) as c:
            await c.query(every)
    stranger = TestCA(d.tls.parent / "stranger", "stranger")
    # the example's CA signs a certificate for a name the server does not list
    made = run_tidings("tls", "new-cert", str(d.tls), "intruder", "--client")
    assert made.returncode == 0, made.stderr
    for tls in (
        d.client_tls(),  # no client certificate
        d.client_tls(str(stranger.client("relay").pem)),  # another CA's, naming `relay`
        d.client_tls(str(d.tls / "intruder.pem")),  # the CA's, naming no identity
    ):
        with pytest.raises((ConnectionClosed, OSError)):
            async with await client.connect(address, tls=tls, timeout=5, request_timeout=5) as c:
                await c.query(every)


def _closed_without_a_certificate(
    d: Deployment, port: int, ca: Path, good: Path, *certs: Path
) -> None:
    """Plaintext, a TLS client (verifying the server by ``ca``) without a certificate, and
    one with each of ``certs``, are closed at the handshake, while one with ``good`` is kept
    (the server waits for its first request)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as raw:
        raw.sendall(b"\x00\x00\x00\x10plaintext, not TLS")
        try:  # at most a TLS alert, then the close (a hang fails on the timeout)
            while raw.recv(1024):
                pass
        except ConnectionResetError:
            pass  # closed as well
    with (
        socket.create_connection(("127.0.0.1", port), timeout=60) as raw,
        d.client_tls(str(good), ca).wrap_socket(raw, server_hostname="127.0.0.1") as kept,
    ):
        kept.settimeout(2)
        with pytest.raises(TimeoutError):
            kept.recv(1024)
    for cert in (None, *certs):
        context = d.client_tls(None if cert is None else str(cert), ca)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as raw:
            try:
                with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    # TLS 1.3: the server checks the client's certificate after the client's
                    # side of the handshake, then sends an alert and closes
                    received = tls.recv(1024)
            except (ssl.SSLError, ConnectionResetError):
                continue
            assert received == b"", (cert, received)


@pytest.mark.slow
@pytest.mark.spark
def test_the_hardened_example_runs_end_to_end_over_tls_and_refuses_at_each_edge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = Deployment(tmp_path, monkeypatch)
    d.make_certificates()
    run = Run(d.path)
    try:
        wait_until(
            lambda: all(part["up"] for part in run.state()["parts"].values()),
            240,
            explain=run.output,
        )
        asyncio.run(asyncio.wait_for(_end_to_end(d), 600))
        # the Syncer: the servers' own CA only, not the relay's
        syncer = d.port("23013")
        peers_ca = d.tls / "peers" / "ca.pem"
        _closed_without_a_certificate(
            d, syncer, peers_ca, d.tls / "peers" / "server.pem", d.tls / "relay.pem"
        )
        eventer = d.port("23012")
        _closed_without_a_certificate(d, eventer, d.tls / "ca.pem", d.tls / "live.pem")
        asyncio.run(asyncio.wait_for(_refused_at_the_eventer(d), 120))
        metrics = httpx.get(f"http://127.0.0.1:{d.port('9465')}/metrics", timeout=30).text
        assert re.search(r'tidings_stream_refusals_total\{reason="authentication"', metrics)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(180) == 0, run.output()
    finally:
        run.close()
    for secret in (BILLING, OPS, d.token):
        assert secret not in run.output()


async def _poll(stream: StreamClient, component: str, count: int) -> list[Any]:
    """Poll until ``count`` events came (acknowledging as it goes), then once more: they
    are all there is."""
    events: list[Any] = []
    for _ in range(300):
        events += await stream.poll(component, events[-1].id if events else None)
        if len(events) >= count:
            break
        await asyncio.sleep(0.2)
    events += await stream.poll(component, events[-1].id if events else None)
    return events


async def _end_to_end(d: Deployment) -> None:
    live_url = f"wss://127.0.0.1:{d.port('8100')}/"
    stream_url = f"https://127.0.0.1:{d.port('8090')}/orders"
    tls = d.client_tls()
    # the stream's consumers and the intermediary's subscriber, before the events are written
    billing = StreamClient(stream_url, "billing", BILLING, tls=tls)
    ops = StreamClient(stream_url, "ops", OPS, tls=tls)
    await billing.register("BILLING")
    await ops.register("OPS")
    with pytest.raises(StreamError) as refused:
        await billing.register("AUDIT")  # a component it was not granted
    assert refused.value.name == "Unauthorized"
    async with await IntermediaryClient.connect(
        live_url, credentials=Credentials(token=d.token), tls=tls
    ) as dashboard:
        assert dashboard.identity == "dashboard"
        await dashboard.subscribe_events("orders", [["shop", "OrderPlaced"]])
        with pytest.raises(SubscriptionRefused, match="dashboard"):
            await dashboard.subscribe_events("all", [["shop", "*"]])  # beyond its grant
        outbox = Outbox(
            make_engine(f"sqlite:///{d.path.parent / 'data' / 'hardened' / 'shop.db'}"),
            OutboxConfig(originator="shop"),
        )
        with outbox.transaction() as tx:
            tx.emit("OrderPlaced", {"order": 1, "tenant": "acme"}, partition_key="1")
            tx.emit("OrderPlaced", {"order": 2, "tenant": "globex"}, partition_key="2")
            emit_row(tx, "customer", 7, {"id": 7, "name": "Ada", "city": "Oslo"})
        got = []
        while len(got) < 2:  # its events, between status messages (upstream stale, ...)
            message = await dashboard.message(300)
            if message["op"] == "event":
                got.append(message)
        assert [m["payload"]["data"]["order"] for m in got] == [1, 2]
    # the same events over the stream: ops reads both, billing tenant acme's only
    # (an FTN18 event's data is the envelope the relay stored: the payload is its data)
    assert [e.data["data"]["order"] for e in await _poll(ops, "OPS", 2)] == [1, 2]
    billed = await _poll(billing, "BILLING", 1)
    assert [e.data["data"] for e in billed] == [{"order": 1, "tenant": "acme"}]
    await ops.aclose()
    await billing.aclose()
    # refused at the stream: a wrong password, plaintext, an unverified server
    async with StreamClient(stream_url, "billing", "wrong", tls=tls) as wrong:
        with pytest.raises(StreamError) as refused:
            await wrong.register("BILLING")
        assert refused.value.name == "SecurityError"
    async with StreamClient(stream_url.replace("https:", "http:"), "ops", OPS) as plain:
        with pytest.raises(ConnectionClosed):
            await plain.register("OPS")
    async with StreamClient(stream_url, "ops", OPS) as unverified:  # the system's CAs
        with pytest.raises(ConnectionClosed, match=r"CERTIFICATE_VERIFY_FAILED|verify failed"):
            await unverified.register("OPS")
    # refused at the intermediary: no credentials, a wrong token, plaintext
    with pytest.raises(AccessRefused, match="anonymous"):
        await IntermediaryClient.connect(live_url, tls=tls)
    with pytest.raises(AccessRefused):
        await IntermediaryClient.connect(
            live_url, credentials=Credentials(token=new_token()), tls=tls
        )
    with pytest.raises((InvalidHandshake, ConnectionError)):
        await IntermediaryClient.connect(
            live_url.replace("wss:", "ws:"), credentials=Credentials(token=d.token)
        )
    # the ops user sees the customer table over its password
    async with await IntermediaryClient.connect(
        live_url, credentials=Credentials(user="ops", password=OPS), tls=tls
    ) as ops_live:
        await ops_live.subscribe_sql("c", "SELECT id, name FROM customer")
        for _ in range(50):
            message = await ops_live.message(60)
            if "Ada" in json.dumps(message):
                break
        else:
            raise AssertionError("the customer row never reached the SQL view")
