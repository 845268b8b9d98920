"""``tidings tls``: the CA and certificates a user makes to try TLS. What it writes works on a
real TLS connection (mutual, verified, the client's CN seen by the server) with tidings' own
TLS settings; keys are 0600; nothing is replaced without ``--force`` and a refused command
writes nothing; bad input is one clear line."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from click.testing import Result
from typer.testing import CliRunner

from tests.support.certificates import TestCA
from tidings.cli import app
from tidings.config.tls import TlsClientConfig, TlsServerConfig

runner = CliRunner()


def _tls(*args: str) -> Result:
    return runner.invoke(app, ["tls", *args])


def _refused(result: Result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert needle in result.output, result.output


async def _handshake(server: TlsServerConfig, client: TlsClientConfig, host: str) -> str:
    """Connect ``client`` to ``server`` over a real loopback socket; the CN of the client
    certificate the server verified."""
    seen: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("ssl_object").getpeercert()
        subject = dict(item[0] for item in peer["subject"])
        seen.set_result(subject["commonName"])
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server.context())
    port = listener.sockets[0].getsockname()[1]
    async with listener:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client.context(), server_hostname=host
        )
        assert await reader.read() == b"ok"
        writer.close()
        return await seen


def test_init_makes_a_ca_a_server_and_clients_that_work_over_mutual_tls(tmp_path: Path) -> None:
    directory = tmp_path / "tls"
    result = _tls(
        "init", str(directory), "--host", "127.0.0.1", "--host", "localhost", "--client", "relay"
    )
    assert result.exit_code == 0, result.output
    names = {p.name for p in directory.iterdir()}
    assert names == {
        "ca.pem",
        "ca.key",
        *(f"{n}.{s}" for n in ("server", "relay") for s in ("crt", "key", "pem")),
    }
    for path in directory.iterdir():
        mode = path.stat().st_mode & 0o777
        private = path.suffix in (".key", ".pem") and path.name != "ca.pem"
        assert mode == (0o600 if private else 0o644), (path.name, oct(mode))
    server = TlsServerConfig(
        cert_file=str(directory / "server.crt"),
        key_file=str(directory / "server.key"),
        ca_file=str(directory / "ca.pem"),
    )
    relay = TlsClientConfig(
        ca_file=str(directory / "ca.pem"),
        cert_file=str(directory / "relay.pem"),  # certificate and key in one file
    )
    for host in ("127.0.0.1", "localhost"):
        assert asyncio.run(_handshake(server, relay, host)) == "relay"
    # the server's certificate is a client's too: a server of a group dials its peers with it
    peer = TlsClientConfig(
        ca_file=str(directory / "ca.pem"), cert_file=str(directory / "server.pem")
    )
    assert asyncio.run(_handshake(server, peer, "localhost")) == "server"
    # verified: a name the certificate does not hold is refused
    try:
        asyncio.run(_handshake(server, relay, "example.org"))
    except ssl.SSLCertVerificationError as exc:
        assert "example.org" in str(exc)
    else:
        raise AssertionError("a host the certificate does not name was accepted")


def test_new_ca_and_new_cert_add_certificates_to_the_same_ca(tmp_path: Path) -> None:
    assert _tls("new-ca", str(tmp_path), "--name", "shop CA").exit_code == 0
    result = _tls("new-cert", str(tmp_path), "events", "--host", "events.example.org")
    assert result.exit_code == 0, result.output
    assert "server certificate 'events'" in result.output
    result = _tls("new-cert", str(tmp_path), "dashboard", "--client", "--days", "30")
    assert result.exit_code == 0, result.output
    server = TlsServerConfig(
        cert_file=str(tmp_path / "events.crt"),
        key_file=str(tmp_path / "events.key"),
        ca_file=str(tmp_path / "ca.pem"),
    )
    client = TlsClientConfig(
        ca_file=str(tmp_path / "ca.pem"),
        cert_file=str(tmp_path / "dashboard.crt"),
        key_file=str(tmp_path / "dashboard.key"),
    )
    assert asyncio.run(_handshake(server, client, "events.example.org")) == "dashboard"


def test_nothing_is_replaced_without_force_and_a_refused_command_writes_nothing(
    tmp_path: Path,
) -> None:
    assert _tls("init", str(tmp_path), "--host", "127.0.0.1").exit_code == 0
    ca = (tmp_path / "ca.pem").read_bytes()
    _refused(_tls("new-ca", str(tmp_path)), "ca.pem")
    _refused(_tls("init", str(tmp_path), "--host", "127.0.0.1"), "already there")
    _refused(_tls("new-cert", str(tmp_path), "server", "--host", "h"), "server.crt")
    assert (tmp_path / "ca.pem").read_bytes() == ca
    # only a client's key is there: init refuses before writing its CA
    other = tmp_path / "other"
    other.mkdir()
    (other / "app.key").write_text("mine")
    _refused(_tls("init", str(other), "--host", "h", "--client", "app"), "app.key")
    assert {p.name for p in other.iterdir()} == {"app.key"}
    assert (other / "app.key").read_text() == "mine"
    # --force replaces, and a file that was readable by others is 0600 again
    (tmp_path / "server.key").chmod(0o644)
    result = _tls("init", str(tmp_path), "--host", "127.0.0.1", "--force")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "ca.pem").read_bytes() != ca
    assert (tmp_path / "server.key").stat().st_mode & 0o777 == 0o600


def test_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    _refused(_tls("new-cert", str(tmp_path / "none"), "x", "--client"), "make the CA first")
    assert not (tmp_path / "none").exists()
    _tls("new-ca", str(tmp_path))
    _refused(_tls("new-cert", str(tmp_path), "x"), "give the hosts a server certificate names")
    _refused(_tls("new-cert", str(tmp_path), "x", "--host", "a b"), "'a b' is neither")
    _refused(_tls("new-cert", str(tmp_path), " x", "--client"), "1 to 64 printable")
    _refused(_tls("new-cert", str(tmp_path), "x", "--client", "--days", "0"), "days: 0")
    _refused(_tls("init", str(tmp_path / "i")), "--host")
    _refused(_tls("init", str(tmp_path / "i"), "--host", "h", "--client", "server"), "alike")
    # a CA whose key is another's, or a certificate that is no CA's
    stranger = TestCA(tmp_path / "stranger")
    (tmp_path / "ca.key").write_bytes(stranger.client("y").key.read_bytes())
    _refused(_tls("new-cert", str(tmp_path), "x", "--client"), "not the key of the CA")
    (tmp_path / "ca.pem").write_text("not a certificate")
    _refused(_tls("new-cert", str(tmp_path), "x", "--client"), "not a PEM certificate")
