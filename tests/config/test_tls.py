"""The shared TLS models: real certificate files (openssl-made), each unusable file named by
its key and path, contexts that verify by default, and a real TLS handshake between the two
sides' contexts over a socket pair."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from tidings.config import validate_config
from tidings.config.model import StrictModel
from tidings.config.tls import TlsClientConfig, TlsServerConfig
from tidings.errors import ConfigError


class _Section(StrictModel):
    """A section holding a ``tls:`` key, as a part's section does."""

    tls: TlsServerConfig


def _server(files: dict[str, str], **extra: str) -> TlsServerConfig:
    data = {"cert_file": files["server.pem"], "key_file": files["server.key"], **extra}
    return validate_config(TlsServerConfig, data, "tls")


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[str, str]:
    """Both sides of a TLS handshake over a socket pair: each side's outcome (``ok`` or the
    error's text)."""
    left, right = socket.socketpair()
    outcome: dict[str, str] = {}

    def serve() -> None:
        try:
            with server.wrap_socket(left, server_side=True) as tls:
                tls.recv(1)
            outcome["server"] = "ok"
        except (ssl.SSLError, OSError) as exc:
            outcome["server"] = str(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(right, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"x")
        outcome["client"] = "ok"
    except (ssl.SSLError, OSError) as exc:
        outcome["client"] = str(exc)
        right.close()
    thread.join(30)
    left.close()
    return outcome["server"], outcome["client"]


def test_a_client_verifies_the_server_against_its_ca_and_refuses_another(
    tls_files: dict[str, str],
) -> None:
    server = _server(tls_files).context()
    trusting = TlsClientConfig(ca_file=tls_files["ca.pem"]).context()
    assert _handshake(server, trusting) == ("ok", "ok")
    assert trusting.verify_mode is ssl.CERT_REQUIRED and trusting.check_hostname
    other = TlsClientConfig(ca_file=tls_files["other-ca.pem"]).context()
    _, refused = _handshake(server, other)
    assert "CERTIFICATE_VERIFY_FAILED" in refused
    system = TlsClientConfig().context()  # the system's CAs do not know the test CA
    assert "CERTIFICATE_VERIFY_FAILED" in _handshake(server, system)[1]
    unverified = TlsClientConfig(verify=False).context()
    assert _handshake(server, unverified) == ("ok", "ok")


def test_mutual_tls_needs_a_client_certificate_of_the_clients_ca(
    tls_files: dict[str, str],
) -> None:
    server = _server(tls_files, ca_file=tls_files["ca.pem"]).context()
    with_cert = TlsClientConfig(
        ca_file=tls_files["ca.pem"],
        cert_file=tls_files["client.pem"],
        key_file=tls_files["client.key"],
    ).context()
    assert _handshake(server, with_cert) == ("ok", "ok")
    without = TlsClientConfig(ca_file=tls_files["ca.pem"]).context()
    refused_by_server, _ = _handshake(server, without)
    assert "certificate" in refused_by_server.lower()


def test_each_unusable_file_is_named_by_its_key(tls_files: dict[str, str], tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.pem")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", tls_files["server.key"], "-aes256", "-passout", "pass:pw",
         "-out", str(encrypted)],
        check=True, capture_output=True,
    )  # fmt: skip
    cases = [
        ({"cert_file": missing}, rf"tls: cert_file {missing}: cannot read it: No such file"),
        ({"key_file": missing}, rf"tls: key_file {missing}: cannot read it"),
        ({"cert_file": str(garbage)}, r"cert_file .*garbage.pem and its key_file .*: not a PEM"),
        ({"key_file": tls_files["client.key"]}, r"the key does not belong to the certificate"),
        ({"key_file": str(encrypted)}, r"key_file .*encrypted.key: the key is encrypted"),
        ({"ca_file": str(garbage)}, r"ca_file .*garbage.pem: not PEM CA"),
    ]
    for change, message in cases:
        data = {"cert_file": tls_files["server.pem"], "key_file": tls_files["server.key"]}
        with pytest.raises(ConfigError, match=message):
            validate_config(_Section, {"tls": data | change}, "section")
    with pytest.raises(ConfigError, match=rf"ca_file {missing}: cannot read it"):
        validate_config(TlsClientConfig, {"ca_file": missing}, "tls")
    with pytest.raises(ConfigError, match="key_file is set without cert_file"):
        validate_config(TlsClientConfig, {"key_file": tls_files["client.key"]}, "tls")
    both = tmp_path / "both.pem"  # a certificate with its key in one file, as hat's pem_file
    both.write_text(
        Path(tls_files["server.pem"]).read_text() + Path(tls_files["server.key"]).read_text()
    )
    assert TlsServerConfig(cert_file=str(both)).context() is not None
    with pytest.raises(ConfigError, match=r"unknown key"):
        validate_config(TlsServerConfig, {"cert_file": "a", "key_file": "b", "ca": "c"}, "tls")
