"""TLS settings, one shape for every link tidings makes or serves over TLS.

A server side (:class:`TlsServerConfig`) has its certificate and key, and optionally a CA:
with one, every client must present a certificate signed by it (mutual TLS), and the
certificate's subject common name (CN) is the client's identity. A client side
(:class:`TlsClientConfig`) verifies the server by default, against a CA file or the system's
CAs, with the hostname check; it may present a certificate of its own.

The files are checked when the configuration is read (there, readable), and loaded into an
:class:`ssl.SSLContext` when a server starts listening (once) or a client connects (each
time, so a renewed certificate is used from the next connection on). A file that cannot be
loaded then is a :class:`~tidings.errors.TlsError` naming it and what is wrong with it. It
is also an :class:`OSError`, as a failed connection is, so a part that reconnects goes on
trying, and says why each time.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator, model_validator

from tidings.config.model import LocalPath, StrictModel
from tidings.errors import TlsError

#: The oldest protocol version either side accepts (hat-event's own contexts allow TLS 1.2
#: and 1.3 with Python's defaults, so its clients and servers meet ours there).
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


def readable_file(what: str, path: str | None) -> str | None:
    """A configured file (certificates, keys, credentials) must be there, and readable, when
    the configuration is read, not at the first connection: a ValueError naming ``what``."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise ValueError(f"{what} file {path!r} does not exist (or is not a file)")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{what} file {path!r} is not readable by this process")
    return path


class TlsServerConfig(StrictModel):
    """TLS on a listening socket: the server's certificate and key, and, for mutual TLS, the
    CA whose certificates clients must present."""

    cert_file: LocalPath = Field(
        description=(
            "The server's certificate chain (PEM), leaf first; it may hold the key too (one "
            "file, as hat-event's ``pem_file``)."
        ),
    )
    key_file: LocalPath | None = Field(
        default=None, description="The certificate's private key (PEM), if not in ``cert_file``."
    )
    ca_file: LocalPath | None = Field(
        default=None,
        description=(
            "Mutual TLS: every client must present a certificate signed by this CA (PEM), and "
            "its subject CN is the client's identity; absent: clients are not asked for one."
        ),
    )

    @field_validator("cert_file", "key_file", "ca_file")
    @classmethod
    def _files(cls, v: str | None, info: ValidationInfo) -> str | None:
        return readable_file(f"tls.{info.field_name}", v)

    @property
    def mutual(self) -> bool:
        """Clients must present a certificate."""
        return self.ca_file is not None

    def context(self) -> ssl.SSLContext:
        """A server context with these files loaded; a TlsError names a file that is not
        what it should be."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = MINIMUM_VERSION
        _load_chain(context, self.cert_file, self.key_file)
        if self.ca_file is not None:
            # Only this CA: the system's CAs must not vouch for clients.
            _load_ca(context, self.ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


class TlsClientConfig(StrictModel):
    """TLS on a connection this side opens: how the server is verified, and the certificate
    presented if the server asks for one (mutual TLS)."""

    ca_file: LocalPath | None = Field(
        default=None,
        description="The CA that signed the servers' certificates (PEM); absent: the system's CAs.",
    )
    cert_file: LocalPath | None = Field(
        default=None,
        description=(
            "A client certificate (PEM), for servers that require one (mutual TLS); its subject "
            "CN is this client's identity there. It may hold the key too."
        ),
    )
    key_file: LocalPath | None = Field(
        default=None, description="The key of ``cert_file`` (PEM), if not in it."
    )
    verify: bool = Field(
        default=True,
        description=(
            "Check the server's certificate and name. ``false`` encrypts without knowing who "
            "answers (what hat-event 0.8.5's own client does); every connection logs a warning."
        ),
    )
    server_name: str | None = Field(
        default=None,
        min_length=1,
        description="The name the server's certificate must hold, if not the address's host.",
    )

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _files(cls, v: str | None, info: ValidationInfo) -> str | None:
        return readable_file(f"tls.{info.field_name}", v)

    @model_validator(mode="after")
    def _consistent(self) -> TlsClientConfig:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("tls.key_file is set without tls.cert_file")
        if not self.verify and (self.ca_file is not None or self.server_name is not None):
            raise ValueError(
                "tls.verify is false: ca_file and server_name would not be used (remove them, "
                "or verify)"
            )
        return self

    def context(self) -> ssl.SSLContext:
        """A client context with these files loaded; a TlsError names a file that is not
        what it should be."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = MINIMUM_VERSION
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif self.ca_file is not None:
            _load_ca(context, self.ca_file)
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if self.cert_file is not None:
            _load_chain(context, self.cert_file, self.key_file)
        return context


class _EncryptedKey(Exception):
    """Raised by :func:`_encrypted_key` to leave ``load_cert_chain``."""


def _encrypted_key() -> bytes:
    """Called by OpenSSL only for an encrypted key: without a callback it would prompt for
    a passphrase on the terminal, and a part started by a supervisor would hang."""
    raise _EncryptedKey


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str | None) -> None:
    files = f"tls.cert_file {cert_file!r}" + (
        f" with tls.key_file {key_file!r}" if key_file else ""
    )
    try:
        context.load_cert_chain(cert_file, key_file, password=_encrypted_key)
    except _EncryptedKey:
        raise TlsError(
            f"{files}: the private key is encrypted; tidings takes unencrypted keys only "
            "(protect the file by its permissions)"
        ) from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            why = "the key does not belong to the certificate"
        else:
            why = "not a PEM certificate with its private key"
        raise TlsError(f"{files}: {why} ({_reason(exc)})") from None
    except OSError as exc:
        raise TlsError(f"{files}: cannot be read: {exc.strerror or exc}") from None


def _load_ca(context: ssl.SSLContext, ca_file: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise TlsError(
            f"tls.ca_file {ca_file!r}: not a PEM CA certificate ({_reason(exc)})"
        ) from None
    except OSError as exc:
        raise TlsError(f"tls.ca_file {ca_file!r}: cannot be read: {exc.strerror or exc}") from None


def _reason(exc: ssl.SSLError) -> str:
    """OpenSSL's short reason (``PEM_LIB``, ``NO_START_LINE``...), or the message."""
    return str(exc.reason or exc.strerror or exc)
