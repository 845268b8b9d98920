"""Password hashes as configurations hold them: ``scrypt$N$r$p$salt$digest``.

A configuration keeps only hashes (``tidings streams hash-password`` makes one), so a leaked
file does not leak the passwords. This module is the one definition of the format: making a
hash, checking that a configured value is one (when the file is validated), and reading it
back for a check (the streams' authentication, :mod:`tidings.streams.service.auth`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from tidings.errors import ConfigError

#: scrypt cost (N, r, p): ~50 ms and 16 MiB per check on a current core.
SCRYPT_COST = (2**14, 8, 1)
_N, _R, _P = SCRYPT_COST
_PREFIX = "scrypt"


def hash_password(password: str, *, n: int = _N, r: int = _R, p: int = _P) -> str:
    """A storable hash of ``password``: ``scrypt$N$r$p$salt$digest`` (base64)."""
    if not password:
        raise ConfigError("a password must not be empty")
    salt = secrets.token_bytes(16)
    digest = scrypt(password, salt, n, r, p)
    return "$".join((_PREFIX, str(n), str(r), str(p), _b64(salt), _b64(digest)))


def check_hash(value: str) -> str:
    """``value`` if it is a hash :func:`hash_password` could have made, else ConfigError."""
    parse_hash(value)
    return value


def parse_hash(value: str) -> tuple[int, int, int, bytes, bytes]:
    """The cost (N, r, p), salt and digest of a hash; ConfigError if it is not one."""
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


def password_matches(password: str, stored: str) -> bool:
    """Whether ``password`` is the one ``stored`` (a valid hash) was made of; compared in
    constant time. Costs a hash's scrypt (see :data:`SCRYPT_COST`): call it off the loop."""
    n, r, p, salt, digest = parse_hash(stored)
    return hmac.compare_digest(scrypt(password, salt, n, r, p), digest)


def scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    """The digest of ``password`` with ``salt`` at the cost (n, r, p)."""
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=256 * 1024 * 1024, dklen=32
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
