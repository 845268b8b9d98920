"""Opening a Chatter connection to a server: plaintext (``tcp+sbs://``) or TLS (``ssl+sbs://``).

The frames are :mod:`tidings.wire.chatter`'s either way; what this adds is reaching the
address, the client side of TLS (verification on by default, the certificate checked
against the address's host), and a handshake failure told apart from a refused connection,
so that a user who points a TLS client at a plaintext port (or the reverse) reads why.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Protocol

from tidings.address import parse_endpoint
from tidings.errors import TlsError
from tidings.wire.chatter import DEFAULT_MAX_FRAME_BYTES, DEFAULT_PING_INTERVAL, Connection

log = logging.getLogger(__name__)


class ClientTls(Protocol):
    """TLS settings of a connection to an ``ssl+sbs://`` address: what
    :class:`tidings.config.tls.TlsClientConfig` holds (the wire does not load the
    configuration package; anything with these members will do)."""

    @property
    def verify(self) -> bool: ...

    @property
    def server_name(self) -> str | None: ...

    def context(self) -> ssl.SSLContext: ...


async def connect(
    address: str,
    *,
    tls: ClientTls | ssl.SSLContext | None = None,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ping_interval: float | None = DEFAULT_PING_INTERVAL,
    timeout: float = 10.0,
) -> Connection:
    """Open a connection to ``address`` (``tcp+sbs://host:port`` or ``ssl+sbs://host:port``).

    An ``ssl+sbs`` address is reached over TLS as ``tls`` says (settings, whose context is
    made for this connection, or a ready :class:`ssl.SSLContext`); without ``tls`` the
    server's certificate is verified against the system's CAs. Unless verification is off,
    the certificate must name the address's host (or ``server_name``). A ``tcp+sbs``
    address is plaintext whatever ``tls`` says (a group may mix the two). A handshake that
    fails is a :class:`TlsError` saying why (an OSError, as a refused connection is);
    ``timeout`` bounds connecting and the handshake together.
    """
    host, port, secure = parse_endpoint(address)
    context, server_hostname = None, None
    if secure:
        context, server_hostname = _client_context(address, host, tls)
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=context, server_hostname=server_hostname
            )
    except ssl.SSLCertVerificationError as exc:
        raise TlsError(
            f"TLS to {address}: the server's certificate is refused: {exc.verify_message}"
        ) from None
    except ssl.SSLError as exc:
        raise TlsError(
            f"TLS to {address}: handshake failed ({exc.reason or exc}); does the server serve "
            "ssl+sbs there?"
        ) from None
    except ConnectionResetError as exc:
        if not secure:
            raise
        raise TlsError(
            f"TLS to {address}: the server closed the connection during the handshake "
            f"({str(exc) or type(exc).__name__}); "
            "does the server serve ssl+sbs there?"
        ) from None
    return Connection(
        reader, writer, max_frame_bytes=max_frame_bytes, ping_interval=ping_interval, to_server=True
    )


def _client_context(
    address: str, host: str, tls: ClientTls | ssl.SSLContext | None
) -> tuple[ssl.SSLContext, str | None]:
    """The context of a TLS connection to ``address`` and the name its certificate must
    hold (None when the context checks no name)."""
    if tls is None:
        return ssl.create_default_context(), host
    if isinstance(tls, ssl.SSLContext):
        return tls, host if tls.check_hostname else None
    if not tls.verify:
        log.warning(
            "TLS to %s without verifying the server (tls.verify: false)",
            address,
            extra={"address": address},
        )
        return tls.context(), None
    return tls.context(), tls.server_name or host
