"""Addresses of chatter servers: ``tcp+sbs://HOST:PORT`` and, over TLS, ``ssl+sbs://HOST:PORT``.

The two schemes are hat-event 0.8.5's (``hat.chatter``): ``ssl+sbs`` carries the same frames
as ``tcp+sbs`` inside a TLS session. The configuration checks addresses on load and the wire
connects and listens on them, so they sit below both (beside the configuration, importing
nothing of tidings but its errors) and the configuration does not have to import the wire.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, NamedTuple
from urllib.parse import urlsplit

from pydantic import AfterValidator

from tidings.errors import ConfigError

#: The plaintext scheme and the TLS one (hat-event's names).
PLAIN_SCHEME = "tcp+sbs"
TLS_SCHEME = "ssl+sbs"


class Endpoint(NamedTuple):
    """What an address names: the host, the port, and whether the link is TLS."""

    host: str
    port: int
    tls: bool


def parse_endpoint(address: str) -> Endpoint:
    """Host, port and scheme of a ``tcp+sbs://`` or ``ssl+sbs://`` address; anything else is
    a ConfigError."""
    if not isinstance(address, str):
        raise ConfigError(f"address must be a string like tcp+sbs://HOST:PORT, not {address!r}")
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"address {address!r}: {exc}") from exc
    if parts.scheme not in (PLAIN_SCHEME, TLS_SCHEME):
        raise ConfigError(f"address {address!r}: scheme must be tcp+sbs or ssl+sbs (TLS)")
    if not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ConfigError(f"address {address!r}: expected {parts.scheme}://HOST:PORT")
    return Endpoint(parts.hostname, port, parts.scheme == TLS_SCHEME)


def parse_address(address: str) -> tuple[str, int]:
    """Host and port of a ``tcp+sbs://`` or ``ssl+sbs://`` address (see :func:`parse_endpoint`)."""
    host, port, _ = parse_endpoint(address)
    return host, port


def is_tls(address: str) -> bool:
    """Whether ``address`` (a valid one) is an ``ssl+sbs://`` address."""
    return parse_endpoint(address).tls


def _checked(address: str) -> str:
    """``address`` if valid; a ValueError (pydantic reports it with the key) otherwise."""
    try:
        parse_endpoint(address)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return address


def _plain(address: str) -> str:
    """``address`` if it is a valid ``tcp+sbs://`` address (a Monitor Server's)."""
    if _checked(address).startswith(TLS_SCHEME):
        raise ValueError(
            f"address {address!r}: a Monitor Server is reached over tcp+sbs only: hat-monitor "
            "0.7.2 can give its server no certificate and its client checks none; keep the "
            "Monitor Server on this host (its address on loopback)"
        )
    return address


#: A configuration field holding a ``tcp+sbs://`` or ``ssl+sbs://`` address, checked on load.
Address = Annotated[str, AfterValidator(_checked)]
#: A Monitor Server's address: ``tcp+sbs://`` only (see :func:`_plain`).
MonitorAddress = Annotated[str, AfterValidator(_plain)]


def is_loopback(host: str | None) -> bool:
    """Whether a peer's address is this machine's (127.0.0.0/8, ::1, or ::ffff:127.x)."""
    try:
        address = ipaddress.ip_address((host or "").split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
