"""FTN8 basic authentication of stream callers against the configured users.

The FutoIn client's simplest mode sends ``"sec": "user:password"`` with every request. The
configuration keeps only scrypt hashes of the passwords (:mod:`tidings.config.passwords`), so
a leaked configuration does not leak them. scrypt is slow on purpose, and every request
carries the password again, so a pair that verified once is remembered (as a keyed digest,
never the password itself) and later requests cost one HMAC; a wrong password is checked in
full every time.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from threading import Lock

from tidings.config.passwords import SCRYPT_COST, parse_hash, scrypt
from tidings.errors import StreamError
from tidings.streams.protocol.ftn3 import SECURITY_ERROR

_MAX_SEC_CHARS = 1024


class Users:
    """The users a stream server accepts: name -> password hash."""

    def __init__(self, hashes: Mapping[str, str]) -> None:
        self._hashes = {name: parse_hash(value) for name, value in hashes.items()}
        self._key = secrets.token_bytes(32)
        self._verified: set[bytes] = set()
        self._lock = Lock()

    def remembered(self, sec: str | None) -> str | None:
        """The user of ``sec`` if that pair verified before (one HMAC: call it anywhere)."""
        if sec is None or len(sec) > _MAX_SEC_CHARS:
            return None
        token = hmac.digest(self._key, sec.encode(), "sha256")
        with self._lock:
            if token in self._verified:
                return sec.partition(":")[0]
        return None

    def authenticate(self, sec: str | None) -> str:
        """The user named by an FTN8 basic ``sec`` (``user:password``); SecurityError if
        there is none, the mode is not basic, or the password is wrong. Slow (scrypt) for
        a pair not verified before: call it from a worker thread."""
        if sec is None:
            raise StreamError(SECURITY_ERROR, "Anonymous not allowed: send sec user:password")
        if len(sec) > _MAX_SEC_CHARS:
            raise StreamError(SECURITY_ERROR, "sec is too long")
        user, colon, password = sec.partition(":")
        if not colon or not user or user.startswith("-") or ":" in password:
            raise StreamError(
                SECURITY_ERROR, "only FTN8 basic authentication (sec = user:password) is enabled"
            )
        token = hmac.digest(self._key, sec.encode(), "sha256")
        with self._lock:
            if token in self._verified:
                return user
        stored = self._hashes.get(user)
        # An unknown user costs a full check too, so that timing does not tell users apart.
        n, r, p, salt, digest = stored or (*SCRYPT_COST, b"\0" * 16, b"")
        candidate = scrypt(password, salt, n, r, p)
        if stored is None or not hmac.compare_digest(candidate, digest):
            raise StreamError(SECURITY_ERROR, "Basic Auth Verification Failed")
        with self._lock:
            self._verified.add(token)
        return user
