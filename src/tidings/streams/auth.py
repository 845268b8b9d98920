"""FTN8 basic authentication of stream callers against the configured users.

The FutoIn client's simplest mode sends ``"sec": "user:password"`` with every request. The
configuration keeps only scrypt hashes of the passwords (``tidings streams hash-password``
makes one), so a leaked configuration does not leak them. scrypt is slow on purpose, and
every request carries the password again, so a pair that verified once is remembered (as a
keyed digest, never the password itself) and later requests cost one HMAC; a wrong
password is checked in full every time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from threading import Lock

from tidings.errors import ConfigError, StreamError
from tidings.streams.ftn3 import SECURITY_ERROR

#: scrypt cost (N, r, p): ~50 ms and 16 MiB per check on a current core.
_N, _R, _P = 2**14, 8, 1
_PREFIX = "scrypt"
_MAX_SEC_CHARS = 1024


def hash_password(password: str, *, n: int = _N, r: int = _R, p: int = _P) -> str:
    """A storable hash of ``password``: ``scrypt$N$r$p$salt$digest`` (base64)."""
    if not password:
        raise ConfigError("a password must not be empty")
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, n, r, p)
    return "$".join((_PREFIX, str(n), str(r), str(p), _b64(salt), _b64(digest)))


def check_hash(value: str) -> str:
    """``value`` if it is a hash :func:`hash_password` could have made, else ConfigError."""
    _parse(value)
    return value


class Users:
    """The users a stream server accepts: name -> password hash."""

    def __init__(self, hashes: Mapping[str, str]) -> None:
        self._hashes = {name: _parse(value) for name, value in hashes.items()}
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
        n, r, p, salt, digest = stored or (_N, _R, _P, b"\0" * 16, b"")
        candidate = _scrypt(password, salt, n, r, p)
        if stored is None or not hmac.compare_digest(candidate, digest):
            raise StreamError(SECURITY_ERROR, "Basic Auth Verification Failed")
        with self._lock:
            self._verified.add(token)
        return user


def _parse(value: str) -> tuple[int, int, int, bytes, bytes]:
    parts = value.split("$") if isinstance(value, str) else []
    try:
        if len(parts) != 6 or parts[0] != _PREFIX:
            raise ValueError
        n, r, p = (int(x) for x in parts[1:4])
        salt, digest = (
            base64.b64decode(parts[4], validate=True),
            base64.b64decode(parts[5], validate=True),
        )
        if n < 2 or n & (n - 1) or r < 1 or p < 1 or not salt or not digest:
            raise ValueError
    except ValueError:
        raise ConfigError(
            "a password hash must be scrypt$N$r$p$salt$digest as `tidings streams "
            "hash-password` prints it (passwords are never configured in clear)"
        ) from None
    return n, r, p, salt, digest


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=256 * 1024 * 1024, dklen=32
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
