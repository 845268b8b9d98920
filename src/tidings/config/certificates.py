"""Certificates for trying and running tidings over TLS: a private CA and what it signs.

Every edge of a deployment can run over verified TLS (:mod:`.tls`), which needs a CA and
certificates. Users who have no PKI of their own get them from ``tidings tls`` (and the
tests from ``tests/support/certificates.py``), both made here so that what the tests prove
is what users run:

- a **CA**: an EC P-256 key and a self-signed certificate allowed to sign certificates only
  (``BasicConstraints(ca=True, path_length=0)``, ``keyCertSign``);
- **server certificates** naming their hosts in subjectAltName (IP addresses as IP entries,
  names as DNS entries: a verifying client checks the host it dialled against them), with the
  ``serverAuth`` usage;
- **client certificates** whose subject common name (CN) is the identity a tidings server
  takes them for (mutual TLS), with the ``clientAuth`` usage. One certificate may be both
  (a server of a group is also its peers' Syncer client).

Keys are unencrypted PKCS#8 PEM (tidings loads no encrypted key: a part started by a
supervisor cannot answer a passphrase prompt), so they are protected by their file mode:
written 0600, created with that mode (never readable by others, not even for a moment). A
file that exists is not replaced unless asked (``force``): replacing a CA's key silently
would orphan every certificate it signed.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tidings.errors import TlsError, UsageError

#: How long a certificate is valid unless told otherwise (``--days``).
DEFAULT_DAYS = 365
#: The file names of a CA in its directory: its certificate (given to every verifier) and
#: its key (kept by whoever signs).
CA_CERT = "ca.pem"
CA_KEY = "ca.key"
#: How far back a certificate's validity starts: clocks of the hosts differ a little.
_BACKDATE = datetime.timedelta(hours=1)
_MAX_DAYS = 100 * 366


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, in memory."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


@dataclass(frozen=True)
class Issued:
    """A certificate's files: ``cert`` (PEM), ``key`` (PEM, 0600) and ``pem``, both in one
    file (0600), which is what hat-event's ``pem_file`` takes."""

    cert: Path
    key: Path
    pem: Path


def _validity(days: float) -> tuple[datetime.datetime, datetime.datetime]:
    if not 0 < days <= _MAX_DAYS:
        raise UsageError(f"days: {days:g} is not a validity (more than 0, at most {_MAX_DAYS})")
    now = datetime.datetime.now(datetime.UTC)
    return now - _BACKDATE, now + datetime.timedelta(days=days)


def _common_name(name: str) -> x509.Name:
    if not name or name != name.strip() or len(name) > 64 or not name.isprintable():
        raise UsageError(
            f"name {name!r}: a certificate's name is 1 to 64 printable characters, without "
            "spaces around them"
        )
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])


def make_ca(common_name: str, *, days: float = DEFAULT_DAYS) -> KeyPair:
    """A new CA: a key and its self-signed certificate, which may sign leaf certificates
    only (path length 0)."""
    subject = _common_name(common_name)
    start, end = _validity(days)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def host_names(hosts: tuple[str, ...] | list[str]) -> list[x509.GeneralName]:
    """subjectAltName entries for ``hosts``: an IP address as an IP entry (what a client
    dialling the address checks), anything else as a DNS name (``*.example.org`` allowed)."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
            continue
        except ValueError:
            pass
        label = host.removeprefix("*.")
        if not label or not all(
            part and len(part) <= 63 and part.replace("-", "").isalnum() and part.isascii()
            for part in label.split(".")
        ):
            raise UsageError(f"host {host!r} is neither an IP address nor a DNS name")
        names.append(x509.DNSName(host.lower()))
    return names


def make_certificate(
    ca: KeyPair,
    common_name: str,
    *,
    hosts: tuple[str, ...] | list[str] = (),
    client: bool = False,
    days: float = DEFAULT_DAYS,
) -> KeyPair:
    """A certificate ``ca`` signs: for a server with ``hosts`` (its subjectAltName), for a
    client with ``client`` (its CN is its identity), or for both."""
    if not hosts and not client:
        raise UsageError(
            f"certificate {common_name!r}: give the hosts a server certificate names, or make "
            "it a client certificate (or both)"
        )
    subject = _common_name(common_name)
    start, end = _validity(days)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if hosts else []
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(min(end, ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(host_names(hosts)), critical=False
        )
    return KeyPair(builder.sign(ca.key, hashes.SHA256()), key)


def refuse_existing(paths: list[Path], force: bool) -> None:
    """Before writing anything: a UsageError naming the files that exist (without
    ``force``), so that a refused command leaves no file half-made."""
    existing = [path for path in paths if path.exists()]
    if existing and not force:
        ca = any(path.name == CA_KEY for path in existing)
        raise UsageError(
            f"{', '.join(map(str, existing))}: already there, not replaced (--force replaces "
            + (
                "them; every certificate the old CA signed must then be made again)"
                if ca
                else "them)"
            )
        )


def write_file(path: Path, data: bytes, *, private: bool) -> None:
    """Write ``data`` to ``path``: a private file is created 0600 (and made so if it was
    there), a public one 0644."""
    mode = 0o600 if private else 0o644
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # an existing file keeps its mode through O_CREAT
        os.write(fd, data)
    finally:
        os.close(fd)


def write_ca(directory: Path, ca: KeyPair, *, force: bool = False) -> tuple[Path, Path]:
    """Write ``ca`` as ``ca.pem`` and ``ca.key`` (0600) in ``directory``: their paths."""
    cert, key = directory / CA_CERT, directory / CA_KEY
    refuse_existing([cert, key], force)
    write_file(key, ca.key_pem(), private=True)
    write_file(cert, ca.cert_pem(), private=False)
    return cert, key


def write_issued(directory: Path, stem: str, pair: KeyPair, *, force: bool = False) -> Issued:
    """Write ``pair`` as ``<stem>.crt``, ``<stem>.key`` and ``<stem>.pem`` in ``directory``."""
    if not stem or "/" in stem or stem.startswith(".") or stem in (CA_CERT, CA_KEY):
        raise UsageError(f"name {stem!r} cannot name a certificate's files")
    issued = Issued(*(directory / f"{stem}.{suffix}" for suffix in ("crt", "key", "pem")))
    refuse_existing([issued.cert, issued.key, issued.pem], force)
    write_file(issued.key, pair.key_pem(), private=True)
    write_file(issued.pem, pair.cert_pem() + pair.key_pem(), private=True)
    write_file(issued.cert, pair.cert_pem(), private=False)
    return issued


def load_ca(directory: Path) -> KeyPair:
    """The CA of ``directory`` (``ca.pem`` and ``ca.key``, as :func:`write_ca` wrote them);
    a TlsError names a file that is missing or not what it should be."""
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    for path in (cert_path, key_path):
        if not path.is_file():
            raise TlsError(
                f"{path}: no such file; make the CA first (tidings tls new-ca {directory})"
            )
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError:
        raise TlsError(f"{cert_path}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError):
        raise TlsError(f"{key_path}: not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise TlsError(f"{key_path}: not the key of the CA certificate {cert_path}")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise TlsError(f"{cert_path}: not a CA certificate (it may not sign others)")
    return KeyPair(cert, key)


__all__ = [
    "CA_CERT",
    "CA_KEY",
    "DEFAULT_DAYS",
    "Issued",
    "KeyPair",
    "host_names",
    "load_ca",
    "make_ca",
    "make_certificate",
    "refuse_existing",
    "write_ca",
    "write_file",
    "write_issued",
]
