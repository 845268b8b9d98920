"""Who may connect to an intermediary, decided at the WebSocket handshake (issue 30).

:class:`Gatekeeper` holds the configured subscribers (:mod:`tidings.config.intermediary_access`)
as what it checks them by: token digests (one SHA-256 of the presented token, looked up),
password hashes (:class:`~tidings.config.passwords.PasswordBook`: scrypt, a verified pair
remembered), each subscriber's :class:`~.views.grants.Grant`, and whether an anonymous client
is let in from where it connects. :meth:`Gatekeeper.admit` answers a handshake with the
:class:`Grant` of the identity it proved, or refuses it with an
:class:`~tidings.errors.AccessRefused` (401 and why), before the connection is upgraded.

scrypt costs ~50 ms of a core, on purpose; a flood of wrong passwords must not take the
event loop that serves everyone, so a password not verified before is checked in a worker
thread, at most :data:`PASSWORD_CHECKS` at a time (the others wait their turn; the loop
goes on serving frames meanwhile).

With a :class:`~.addresses.LoginThrottle`, an address that failed to log in too often is
refused (429, with ``Retry-After``) before its credentials are looked at, and every refused
credential is counted against its address; the ``/auth`` route of the pages goes through
:meth:`Gatekeeper.admit` too, so it is no way around the throttle. Refusals are counted by
reason (:attr:`Gatekeeper.refusals`) for the metrics.

A tier's members take pieces of views from each other over the same wire; they prove they
are members with a token their supervisor gives each of them when it starts them (never
written anywhere), which grants everything: what a member asks another for is a piece of a
view it already checked against its own subscriber's grant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping

from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket

from tidings.address import is_loopback
from tidings.config.intermediary_access import ANONYMOUS, SubscriberAccess, SubscriberGrant
from tidings.config.passwords import PasswordBook, token_digest
from tidings.errors import AccessRefused
from tidings.intermediary.serving.addresses import LoginThrottle
from tidings.intermediary.serving.credentials import EXPECTED, Credentials, presented
from tidings.intermediary.views.grants import Grant

log = logging.getLogger(__name__)

#: Password checks (scrypt) running at once; more wait.
PASSWORD_CHECKS = 2
#: What a 401 says a client may send (RFC 9110's WWW-Authenticate challenges).
CHALLENGE = 'Bearer realm="tidings", Basic realm="tidings", charset="UTF-8"'
#: A refusal with the same reason is logged again after this many seconds at the soonest
#: (with how many were not logged meanwhile), so a flood of bad handshakes is no log flood.
REFUSAL_LOG_S = 10.0
#: The name a tier's members go by when they subscribe to each other.
PEER = "tier member"


class Gatekeeper:
    """The configured subscribers and the anonymous policy; see the module docstring. Build
    with :meth:`from_config`; must be used on one event loop."""

    def __init__(
        self,
        tokens: Mapping[bytes, str],
        passwords: PasswordBook,
        grants: Mapping[str, Grant],
        anonymous: str,
        anonymous_grant: Grant,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self._tokens = dict(tokens)
        self._passwords = passwords
        self._grants = dict(grants)
        self.anonymous = anonymous
        self._anonymous_grant = anonymous_grant
        self._checks: asyncio.Semaphore | None = None
        #: Refused logins per address (None: not throttled).
        self.throttle = throttle
        #: Handshakes refused (no, malformed or wrong credentials), since the start.
        self.refused = 0
        #: Refusals by reason since the start (``bad_credentials``, ``anonymous``,
        #: ``login_throttled``), /auth's included.
        self.refusals: Counter[str] = Counter()
        self._logged: dict[str, tuple[float, int]] = {}

    @classmethod
    def from_config(
        cls,
        access: SubscriberAccess | None = None,
        *,
        peer_token: str | None = None,
        throttle: LoginThrottle | None = None,
    ) -> Gatekeeper:
        """From the configuration's ``subscribers:`` and ``anonymous:`` (None: the defaults,
        anonymous from loopback only, granted everything); the hashes configured by
        environment variables are read now (ConfigError naming a missing one).
        ``peer_token``: the token of a tier's members (granted everything); ``throttle``:
        the refused logins per address (None: no throttle)."""
        access = access or SubscriberAccess()
        tokens: dict[bytes, str] = {}
        hashes: dict[str, str] = {}
        grants: dict[str, Grant] = {}
        for name, entry in access.subscribers.items():
            where = f"subscribers.{name}"
            digest = entry.token_digest_of(where)
            if digest is not None:
                tokens[digest] = name
            password_hash = entry.password_hash_of(where)
            if password_hash is not None:
                hashes[name] = password_hash
            grants[name] = _grant(name, entry)
        if peer_token is not None:
            tokens[token_digest(peer_token)] = PEER
            grants[PEER] = Grant.everything(PEER)
        anonymous = access.anonymous
        return cls(
            tokens,
            PasswordBook(hashes),
            grants,
            anonymous.allowed_from,
            _grant(ANONYMOUS, anonymous),
            throttle,
        )

    async def handshake(self, websocket: WebSocket) -> Grant | None:
        """:meth:`admit` for a WebSocket handshake: the grant, or None once the client was
        answered 401 with the reason (before the upgrade; counted and logged)."""
        client = websocket.client.host if websocket.client is not None else None
        try:
            return await self.admit(websocket.headers, client)
        except AccessRefused as exc:
            self.refused += 1
            self._log_refusal(client, exc)
            headers = {"WWW-Authenticate": CHALLENGE}
            if exc.retry_after_s is not None:
                headers = {"Retry-After": str(math.ceil(exc.retry_after_s))}
            response = PlainTextResponse(exc.reason, exc.status, headers=headers)
            with contextlib.suppress(Exception):  # the client may be gone already
                await websocket.send_denial_response(response)
            return None

    def _log_refusal(self, client: str | None, exc: AccessRefused) -> None:
        now = time.monotonic()
        last, missed = self._logged.get(exc.reason, (-REFUSAL_LOG_S, 0))
        if now - last < REFUSAL_LOG_S:
            self._logged[exc.reason] = (last, missed + 1)
            return
        if len(self._logged) > 1000:
            self._logged.clear()
        self._logged[exc.reason] = (now, 0)
        log.warning(
            "intermediary: subscriber refused at the handshake: %s",
            exc.reason,
            extra={"client": client, "status": exc.status, "not_logged_before": missed},
        )

    async def admit(self, headers: Mapping[str, str], client: str | None) -> Grant:
        """The grant of the identity a handshake proves (``headers`` with lowercase names,
        ``client`` the peer's address); :class:`AccessRefused` (401, or 429 for an address
        the throttle refuses) with the reason. Each refusal is counted by its reason."""
        if self.throttle is not None:
            left = self.throttle.blocked(client)
            if left is not None:
                self.refusals["login_throttled"] += 1
                raise AccessRefused(
                    429,
                    f"too many failed logins from {client or 'your address'}: its handshakes "
                    f"are refused for {math.ceil(left)} s more",
                    retry_after_s=left,
                )
        try:
            credentials = presented(headers)
            if credentials is not None:
                name = (
                    self._by_token(credentials.token)
                    if credentials.token is not None
                    else await self._by_password(credentials)
                )
                return self._grants[name]
        except AccessRefused:  # malformed or wrong credentials
            self.refusals["bad_credentials"] += 1
            if self.throttle is not None:
                self.throttle.failed(client)
            raise
        try:
            return self._anonymous(client)
        except AccessRefused:
            self.refusals["anonymous"] += 1
            raise

    def _anonymous(self, client: str | None) -> Grant:
        if self.anonymous == "anywhere" or (self.anonymous == "loopback" and is_loopback(client)):
            return self._anonymous_grant
        where = "" if self.anonymous == "nowhere" else f" from {client} (only from this machine)"
        raise AccessRefused(401, f"anonymous subscribers are not allowed here{where}; {EXPECTED}")

    def _by_token(self, token: str) -> str:
        # Looked up by its digest: timing tells at most how a guess's SHA-256 compares
        # with a stored one, which brings no token nearer.
        name = self._tokens.get(token_digest(token))
        if name is None:
            raise AccessRefused(401, "the token is not known here")
        return name

    async def _by_password(self, credentials: Credentials) -> str:
        user, password = credentials.user or "", credentials.password or ""
        if not self._passwords.remembered(user, password):
            if self._checks is None:
                self._checks = asyncio.Semaphore(PASSWORD_CHECKS)
            async with self._checks:
                verified = await asyncio.to_thread(self._passwords.check, user, password)
            if not verified:
                raise AccessRefused(401, f"user {user[:64]!r}: unknown user or wrong password")
        return user


def _grant(name: str, entry: SubscriberGrant) -> Grant:
    """The :class:`Grant` of a configured subscriber (or of anonymous clients)."""
    regions = (
        entry.regions
        if isinstance(entry.regions, str)
        else [(box.lo, box.hi) for box in entry.regions]
    )
    return Grant.of(name, entry.patterns(), entry.tables, regions)
