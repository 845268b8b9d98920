"""How a subscriber says who it is at the WebSocket handshake: both sides of it.

A client sends a token or a user and password in the handshake's ``Authorization`` header,
as HTTP does (``Bearer <token>``, or ``Basic <base64 of user:password>``). A browser's
WebSocket API cannot set a header, so a page offers them as WebSocket subprotocols instead:
``tidings`` and ``tidings.bearer.<token>`` or ``tidings.basic.<base64url of
user:password, unpadded>``; the server answers with ``tidings``, and the credentials never
appear in a URL (which proxies and servers log). The server reads them with
:func:`presented` before it upgrades the connection, so a refusal is an HTTP answer (401)
with the reason (:mod:`.access`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field

from tidings.errors import AccessRefused

#: The subprotocol a page offers (beside its credentials) and the server accepts.
SUBPROTOCOL = "tidings"
_BEARER = f"{SUBPROTOCOL}.bearer."
_BASIC = f"{SUBPROTOCOL}.basic."
#: The longest Authorization value (or credentials subprotocol) read at all.
MAX_CREDENTIAL_CHARS = 2048
#: What a refusal tells the client to send.
EXPECTED = (
    "send a token (Authorization: Bearer <token>) or a user and password "
    "(Authorization: Basic <base64 of user:password>)"
)


@dataclass(frozen=True)
class Credentials:
    """A token, or a user and its password (never shown by ``repr``)."""

    token: str | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.token is None) == (self.user is None) or (self.user is None) != (
            self.password is None
        ):
            raise AccessRefused(401, "credentials: give a token, or a user and a password")
        if self.user is not None and ":" in self.user:
            raise AccessRefused(401, "credentials: a user name has no ':'")

    def headers(self) -> dict[str, str]:
        """The handshake header that carries them."""
        if self.token is not None:
            return {"Authorization": f"Bearer {self.token}"}
        pair = f"{self.user}:{self.password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}

    def subprotocols(self) -> list[str]:
        """The subprotocols that carry them (what a page offers)."""
        if self.token is not None:
            return [SUBPROTOCOL, _BEARER + self.token]
        pair = base64.urlsafe_b64encode(f"{self.user}:{self.password}".encode())
        return [SUBPROTOCOL, _BASIC + pair.decode().rstrip("=")]


def _basic(encoded: str, *, urlsafe: bool) -> Credentials:
    padded = encoded + "=" * (-len(encoded) % 4)
    try:
        raw = (
            base64.urlsafe_b64decode(padded) if urlsafe else base64.b64decode(padded, validate=True)
        )
        pair = raw.decode()
    except (binascii.Error, ValueError):
        raise AccessRefused(
            401, f"Basic credentials are not base64 of user:password; {EXPECTED}"
        ) from None
    user, colon, password = pair.partition(":")
    if not colon or not user:
        raise AccessRefused(401, f"Basic credentials are not user:password; {EXPECTED}")
    return Credentials(user=user, password=password)


def _from_authorization(value: str) -> Credentials:
    scheme, _, rest = value.strip().partition(" ")
    rest = rest.strip()
    if scheme.lower() == "bearer" and rest:
        return Credentials(token=rest)
    if scheme.lower() == "basic" and rest:
        return _basic(rest, urlsafe=False)
    raise AccessRefused(401, f"Authorization: unknown scheme or empty value; {EXPECTED}")


def presented(headers: Mapping[str, str]) -> Credentials | None:
    """The credentials of a handshake's ``headers`` (lowercase names), None if it carries
    none; malformed ones are refused (:class:`AccessRefused`, 401, never quoting them)."""
    authorization = headers.get("authorization")
    if authorization is not None:
        if len(authorization) > MAX_CREDENTIAL_CHARS:
            raise AccessRefused(401, "Authorization: too long")
        return _from_authorization(authorization)
    offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
    carried = [p for p in offered if p.startswith((_BEARER, _BASIC))]
    if not carried:
        return None
    if len(carried) > 1 or SUBPROTOCOL not in offered:
        raise AccessRefused(
            401, f"subprotocols: offer {SUBPROTOCOL!r} and one credentials subprotocol"
        )
    (value,) = carried
    if len(value) > MAX_CREDENTIAL_CHARS:
        raise AccessRefused(401, "subprotocols: the credentials are too long")
    if value.startswith(_BEARER):
        return Credentials(token=value.removeprefix(_BEARER))
    return _basic(value.removeprefix(_BASIC), urlsafe=True)
