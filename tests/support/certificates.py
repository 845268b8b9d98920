"""Certificates for the TLS tests: a throwaway CA and the certificates it signs, as PEM files.

Made with ``cryptography`` (pinned in the dev dependencies) on EC P-256 keys, valid for a
day: a server certificate names ``127.0.0.1`` and ``localhost``, a client certificate has
its identity as the subject common name. A second, unrelated CA makes certificates no
verifier here trusts.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tidings.config.tls import TlsClientConfig, TlsServerConfig

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as files; ``pem`` holds both (hat-event's ``pem_file``)."""

    cert: Path
    key: Path
    pem: Path


class TestCA:
    """A CA in ``directory`` (``<name>-ca.pem``) that issues certificates there."""

    __test__ = False  # not a test class, despite its name

    def __init__(self, directory: Path, name: str = "tidings-test") -> None:
        self.directory = directory
        self.name = name
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = directory / f"{name}-ca.pem"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def server(
        self, name: str = "server", hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    ) -> Issued:
        """A server certificate for ``hosts`` (IP addresses and DNS names)."""
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        return self._issue(name, names, ExtendedKeyUsageOID.SERVER_AUTH)

    def client(self, identity: str) -> Issued:
        """A client certificate whose subject CN is ``identity``."""
        return self._issue(identity, [], ExtendedKeyUsageOID.CLIENT_AUTH)

    def _issue(
        self, common_name: str, names: list[x509.GeneralName], usage: x509.ObjectIdentifier
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + _DAY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        stem = f"{self.name}-{common_name}"
        issued = Issued(*(self.directory / f"{stem}.{suffix}" for suffix in ("crt", "key", "pem")))
        issued.cert.write_bytes(cert_pem)
        issued.key.write_bytes(key_pem)
        issued.pem.write_bytes(cert_pem + key_pem)
        return issued


class TlsSetup:
    """A CA, a server certificate for this host, and the TLS settings of both sides."""

    def __init__(
        self, directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    ) -> None:
        self.ca = TestCA(directory)
        self.server = self.ca.server(hosts=hosts)

    def server_tls(self, *, mutual: bool = False) -> TlsServerConfig:
        """The server's settings; ``mutual``: clients must present a certificate of the CA."""
        return TlsServerConfig(
            cert_file=str(self.server.cert),
            key_file=str(self.server.key),
            ca_file=str(self.ca.cert) if mutual else None,
        )

    def client_tls(self, identity: str | None = None, **options: Any) -> TlsClientConfig:
        """A client's settings trusting the CA; with ``identity``, its certificate too."""
        if identity is not None:
            issued = self.ca.client(identity)
            options = {"cert_file": str(issued.cert), "key_file": str(issued.key), **options}
        return TlsClientConfig(ca_file=str(self.ca.cert), **options)
