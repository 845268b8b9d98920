"""Certificates for the TLS tests: a throwaway CA and the certificates it signs, as PEM files.

Made by :mod:`tidings.config.certificates` (what ``tidings tls`` makes for users) on EC
P-256 keys, valid for a day: a server certificate names ``127.0.0.1`` and ``localhost``, a
client certificate has its identity as the subject common name. A second, unrelated CA
makes certificates no verifier here trusts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidings.config.certificates import (
    Issued,
    KeyPair,
    make_ca,
    make_certificate,
    write_file,
    write_issued,
)
from tidings.config.tls import TlsClientConfig, TlsServerConfig

#: Test certificates live a day (``tidings tls`` makes them, with ``--days``).
_DAYS = 1


class TestCA:
    """A CA in ``directory`` (``<name>-ca.pem``) that issues certificates there (its key
    stays in memory)."""

    __test__ = False  # not a test class, despite its name

    def __init__(self, directory: Path, name: str = "tidings-test") -> None:
        self.directory = directory
        self.name = name
        directory.mkdir(parents=True, exist_ok=True)
        self._ca: KeyPair = make_ca(f"{name} CA", days=_DAYS)
        self.cert = directory / f"{name}-ca.pem"
        write_file(self.cert, self._ca.cert_pem(), private=False)

    def server(
        self, name: str = "server", hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    ) -> Issued:
        """A server certificate for ``hosts`` (IP addresses and DNS names)."""
        return self._issue(name, make_certificate(self._ca, name, hosts=hosts, days=_DAYS))

    def client(self, identity: str) -> Issued:
        """A client certificate whose subject CN is ``identity``."""
        return self._issue(identity, make_certificate(self._ca, identity, client=True, days=_DAYS))

    def _issue(self, common_name: str, pair: KeyPair) -> Issued:
        return write_issued(self.directory, f"{self.name}-{common_name}", pair, force=True)


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
