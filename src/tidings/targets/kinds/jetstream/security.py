"""The JetStream target's credentials, nkey and TLS, as nats-py's own connection options.

A TLS context verifies the servers against the configured CA (else the system's CAs) and
presents a client certificate when one is configured; a file that cannot be loaded any more
(deleted or unreadable since the configuration was read) is a TargetError naming it.
"""

from __future__ import annotations

import ssl
from typing import Any

from tidings.config.tls import TlsClientConfig
from tidings.errors import TargetError, TlsError
from tidings.targets.kinds.jetstream.config import JetStreamTargetConfig


def security_options(config: JetStreamTargetConfig, tls: ssl.SSLContext | None) -> dict[str, Any]:
    """nats-py's options for ``config``'s credentials, nkey and TLS (``tls`` is the context
    built from ``config.tls`` by :func:`tls_context`)."""
    options: dict[str, Any] = {}
    if config.credentials is not None:
        options["user_credentials"] = config.credentials
    if config.nkey is not None:
        options["nkeys_seed"] = config.nkey
    if config.tls is not None:
        options["tls"] = tls
        if config.tls.server_name is not None:
            options["tls_hostname"] = config.tls.server_name
    return options


def tls_context(tls: TlsClientConfig) -> ssl.SSLContext:
    """The client context of ``tls`` (:meth:`TlsClientConfig.context`): the servers verified
    against ``ca_file`` (else the system's CAs), ``cert_file``/``key_file`` presented."""
    try:
        return tls.context()
    except TlsError as exc:
        raise TargetError(f"cannot load the TLS files: {exc}") from None
