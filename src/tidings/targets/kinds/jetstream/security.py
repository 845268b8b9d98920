"""The JetStream target's credentials, nkey and TLS, as nats-py's own connection options.

A TLS context verifies the servers against the configured CA (else the system's CAs) and
presents a client certificate when one is configured; a file that cannot be loaded any more
(deleted or unreadable since the configuration was read) is a TargetError naming it.
"""

from __future__ import annotations

import ssl
from typing import Any

from tidings.errors import TargetError
from tidings.targets.kinds.jetstream.config import JetStreamTargetConfig, JetStreamTls
from tidings.targets.kinds.jetstream.messages import describe


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


def tls_context(tls: JetStreamTls) -> ssl.SSLContext:
    """A client context that verifies the servers against ``ca_file`` (else the system's
    CAs) and presents ``cert_file``/``key_file`` if given."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
        if tls.cert_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(f for f in (tls.ca_file, tls.cert_file, tls.key_file) if f)
        raise TargetError(f"cannot load the TLS files ({files}): {describe(exc)}") from None
    return context
