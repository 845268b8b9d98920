"""TLS as configurations write it, for any part: :class:`TlsServerConfig` (a listening side's
certificate and key, and optionally the CA its clients' certificates must be signed by:
mutual TLS) and :class:`TlsClientConfig` (a connecting side's verification: on by default,
against the system's CAs or a given CA, and optionally a client certificate).

Each builds the :class:`ssl.SSLContext` its side uses (:meth:`TlsServerConfig.context`,
:meth:`TlsClientConfig.context`). The files are checked when the configuration is validated, by
building that context once, so ``tidings config check`` and a start-up both name an
unreadable file, a file that is not PEM, or a key that does not match its certificate,
with the key of the file in question (``tls.cert_file /etc/x.pem: cannot read it: No such
file or directory``); an encrypted key is refused (nothing may prompt for a passphrase).
Relative paths are relative to the configuration file (:data:`.model.LocalPath`).

The models know no part: the intermediaries use them today, and any other edge (the
Eventer, the Syncer, the streams) can take the same keys.
"""

from __future__ import annotations

import ssl

from pydantic import Field, model_validator

from tidings.config.model import LocalPath, StrictModel, as_value_error
from tidings.errors import ConfigError

#: The oldest protocol either side speaks.
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


class _NoPassphrase(Exception):
    """An encrypted key: loading it would ask for a passphrase."""


def _no_passphrase() -> str:
    raise _NoPassphrase


def _key(where: str, name: str) -> str:
    """The key ``name`` under ``where`` (the section's key path; empty: the section itself)."""
    return f"{where}.{name}" if where else name


def _readable(key: str, path: str) -> None:
    """ConfigError naming ``key`` and ``path`` if the file cannot be read."""
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError as exc:
        raise ConfigError(f"{key} {path}: cannot read it: {exc.strerror or exc}") from None


def _load_chain(context: ssl.SSLContext, where: str, cert_file: str, key_file: str | None) -> None:
    """The certificate chain and its key (in ``cert_file`` if ``key_file`` is None) into
    ``context``; ConfigError naming the file."""
    _readable(_key(where, "cert_file"), cert_file)
    if key_file is not None:
        _readable(_key(where, "key_file"), key_file)
    try:
        context.load_cert_chain(cert_file, key_file, password=_no_passphrase)
    except _NoPassphrase:
        raise ConfigError(
            f"{_key(where, 'key_file' if key_file else 'cert_file')} {key_file or cert_file}: "
            "the key is encrypted; give an unencrypted "
            "PEM key (readable by the service's user only)"
        ) from None
    except ssl.SSLError as exc:
        what = (
            "the key does not belong to the certificate"
            if exc.reason == "KEY_VALUES_MISMATCH"
            else f"not a PEM certificate chain and its key ({exc.reason or exc})"
        )
        raise ConfigError(
            f"{_key(where, 'cert_file')} {cert_file} and its key_file {key_file or '(in it)'}: "
            f"{what}"
        ) from None


def _load_ca(context: ssl.SSLContext, key: str, ca_file: str) -> None:
    """Trust the CA certificates of ``ca_file``; ConfigError naming the file."""
    _readable(key, ca_file)
    try:
        context.load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"{key} {ca_file}: not PEM CA certificates ({exc.reason or exc})"
        ) from None


class TlsServerConfig(StrictModel):
    """TLS on a listening socket: its certificate chain and key, and, for mutual TLS, the CA
    every client's certificate must be signed by."""

    cert_file: LocalPath = Field(
        description=(
            "The certificate chain (PEM), the server's certificate first; it may hold the key too."
        )
    )
    key_file: LocalPath | None = Field(
        default=None, description="Its private key (PEM, not encrypted), if not in cert_file."
    )
    ca_file: LocalPath | None = Field(
        default=None,
        description=(
            "Mutual TLS: clients must present a certificate signed by a CA of this file (PEM); "
            "absent: clients are not asked for one."
        ),
    )

    @model_validator(mode="after")
    def _loads(self) -> TlsServerConfig:
        as_value_error(TlsServerConfig.context, self)
        return self

    def context(self, where: str = "") -> ssl.SSLContext:
        """The server side's context (TLS 1.2 or later); ConfigError naming a file that
        cannot be used by its key (``where.<key>``: ``where`` the section's key path)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = MINIMUM_VERSION
        _load_chain(context, where, self.cert_file, self.key_file)
        if self.ca_file is not None:  # only this CA: the system's must not vouch for clients
            _load_ca(context, _key(where, "ca_file"), self.ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


class TlsClientConfig(StrictModel):
    """TLS on a connection this side opens: how the server's certificate is verified, and
    the certificate to present when the server asks for one (mutual TLS)."""

    ca_file: LocalPath | None = Field(
        default=None,
        description=(
            "The CA certificates (PEM) the server's is checked against (absent: the system's)."
        ),
    )
    verify: bool = Field(
        default=True,
        description=(
            "Check the server's certificate and name. ``false`` gives up both, so anyone on the "
            "way can read and change the traffic: for a test bench only."
        ),
    )
    cert_file: LocalPath | None = Field(
        default=None, description="A client certificate chain (PEM), for mutual TLS."
    )
    key_file: LocalPath | None = Field(
        default=None, description="The key of ``cert_file`` (PEM, not encrypted; only with it)."
    )
    server_name: str | None = Field(
        default=None,
        description="The name the server's certificate is checked against, if not the URL's host.",
    )

    @model_validator(mode="after")
    def _loads(self) -> TlsClientConfig:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file is set without cert_file")
        as_value_error(TlsClientConfig.context, self)
        return self

    def context(self, where: str = "") -> ssl.SSLContext:
        """The client side's context (TLS 1.2 or later); ConfigError naming a file that
        cannot be used by its key (``where.<key>``: ``where`` the section's key path)."""
        if self.ca_file is None:
            context = ssl.create_default_context()
        else:  # verifying, against this CA only
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            _load_ca(context, _key(where, "ca_file"), self.ca_file)
        context.minimum_version = MINIMUM_VERSION
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file is not None:
            _load_chain(context, where, self.cert_file, self.key_file)
        return context
