"""Addresses of chatter servers: ``tcp+sbs://HOST:PORT``.

The configuration checks them on load and the wire connects and listens on them, so they sit
below both (beside the configuration, importing nothing of tidings but its errors) and the
configuration does not have to import the wire.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator

from tidings.errors import ConfigError


def parse_address(address: str) -> tuple[str, int]:
    """Host and port of a ``tcp+sbs://host:port`` address; anything else is a ConfigError."""
    if not isinstance(address, str):
        raise ConfigError(f"address must be a string like tcp+sbs://HOST:PORT, not {address!r}")
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"address {address!r}: {exc}") from exc
    if parts.scheme != "tcp+sbs":
        raise ConfigError(f"address {address!r}: scheme must be tcp+sbs (ssl+sbs is not supported)")
    if not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ConfigError(f"address {address!r}: expected tcp+sbs://HOST:PORT")
    return parts.hostname, port


def _checked(address: str) -> str:
    """``address`` if valid; a ValueError (pydantic reports it with the key) otherwise."""
    try:
        parse_address(address)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return address


#: A configuration field holding a ``tcp+sbs://HOST:PORT`` address, checked on load.
Address = Annotated[str, AfterValidator(_checked)]
