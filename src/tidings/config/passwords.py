"""Secrets as configurations hold them: password hashes (``scrypt$N$r$p$salt$digest``) and
token hashes (``sha256$digest``), never the secrets themselves.

A configuration keeps only hashes (``tidings streams hash-password`` makes a password's,
``tidings intermediary new-token`` a token and its hash), so a leaked file does not leak the
secrets. This module is the one definition of both formats: making a hash, checking that a
configured value is one (when the file is validated), reading a hash from the file or from
the environment (:class:`PasswordHashConfig`), and checking a secret against it
(:class:`PasswordBook` for passwords, :func:`token_digest` for tokens), for the streams'
users (:mod:`tidings.streams.service.auth`) and the intermediaries' subscribers
(:mod:`tidings.intermediary.serving.access`) alike.

Why two formats: a password is chosen by a person, so its hash must be slow to guess from
(scrypt, salted, ~50 ms a check); a token is made by :func:`new_token` with 256 random bits,
which no guessing reaches, so one SHA-256 suffices, and being unsalted it can be looked up
by its digest (a token names no user: the one it belongs to is found from it).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Mapping
from threading import Lock
from typing import Any

from pydantic import Field, model_validator

from tidings.config.model import StrictModel, as_value_error
from tidings.errors import ConfigError

#: scrypt cost (N, r, p): ~50 ms and 16 MiB per check on a current core.
SCRYPT_COST = (2**14, 8, 1)
_N, _R, _P = SCRYPT_COST
_PREFIX = "scrypt"
_TOKEN_PREFIX = "sha256"
#: The fewest characters a token may have: :func:`new_token` makes 43.
MIN_TOKEN_CHARS = 32
#: The longest secret checked at all (a longer one is refused before any hashing).
MAX_SECRET_CHARS = 1024


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


def new_token() -> str:
    """A new random token (256 bits, URL-safe: it travels in headers and WebSocket
    subprotocols as it is)."""
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """A storable hash of ``token``: ``sha256$<hex digest>``."""
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"a token must have at least {MIN_TOKEN_CHARS} characters (`tidings intermediary "
            "new-token` makes one)"
        )
    return f"{_TOKEN_PREFIX}${token_digest(token).hex()}"


def token_digest(token: str) -> bytes:
    """The digest a token is looked up by (what :func:`hash_token` stores)."""
    return hashlib.sha256(token.encode()).digest()


def check_token_hash(value: str) -> bytes:
    """The digest held by a token hash :func:`hash_token` could have made, else ConfigError."""
    prefix, _, digest = value.partition("$") if isinstance(value, str) else ("", "", "")
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        raw = b""
    if prefix != _TOKEN_PREFIX or len(raw) != 32:
        raise ConfigError(
            "a token hash must be sha256$<64 hex digits> as `tidings intermediary new-token` "
            "prints it (tokens are never configured in clear)"
        )
    return raw


def hash_from_env(where: str, variable: str, check: Callable[[str], object]) -> str:
    """The hash held by the environment variable ``variable`` (read when a server starts),
    checked by ``check``; ConfigError naming ``where`` and the variable, never its value."""
    value = os.environ.get(variable)
    if not value:
        raise ConfigError(f"{where}: the variable {variable} is not set")
    try:
        check(value)
    except ConfigError as exc:
        raise ConfigError(f"{where} ({variable}): {exc}") from None
    return value


class PasswordHashConfig(StrictModel):
    """A password, as its scrypt hash or the environment variable holding that hash (at most
    one of the two; a model built on this one says whether a password is required)."""

    password_hash: str | None = Field(
        default=None,
        repr=False,
        description=(
            "The scrypt hash of the password, as ``tidings streams hash-password`` prints it."
        ),
    )
    password_hash_env: str | None = Field(
        default=None,
        description="The environment variable holding that hash, read when the server starts.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_clear_password(cls, data: Any) -> Any:
        """A clear ``password`` is refused with what to write instead, and not echoed: the
        file must not hold it, and the error must not spread it further."""
        if isinstance(data, dict) and "password" in data:
            raise ValueError(
                "password: clear passwords are not accepted (the file keeps only a hash); "
                "write password_hash: with the hash that `tidings streams hash-password` "
                "prints for it, or password_hash_env: naming a variable that holds the hash"
            )
        return data

    @model_validator(mode="after")
    def _one_password_source(self) -> PasswordHashConfig:
        if self.password_hash is not None and self.password_hash_env is not None:
            raise ValueError("give one of password_hash and password_hash_env, not both")
        if self.password_hash is not None:
            as_value_error(check_hash, self.password_hash)
        return self

    @property
    def has_password(self) -> bool:
        return self.password_hash is not None or self.password_hash_env is not None

    def password_hash_of(self, where: str) -> str | None:
        """The hash (None: no password), read from the environment if configured so (at
        start-up); ``where`` names the entry in errors."""
        if self.password_hash_env is not None:
            return hash_from_env(f"{where}.password_hash_env", self.password_hash_env, check_hash)
        return self.password_hash


class PasswordBook:
    """Names and their password hashes, and the check of a name and password against them.

    scrypt is slow on purpose, and a client may send the same pair again and again (FTN8
    basic sends it with every request; a subscriber with every reconnection), so a pair that
    verified once is remembered, as a keyed digest, never the password itself, and checking
    it again costs one HMAC (:meth:`remembered`); a wrong password is checked in full every
    time, and so is an unknown name, so that timing does not tell names apart."""

    def __init__(self, hashes: Mapping[str, str]) -> None:
        self._hashes = {name: check_hash(value) for name, value in hashes.items()}
        self._key = secrets.token_bytes(32)
        self._verified: set[bytes] = set()
        self._lock = Lock()

    def __contains__(self, name: object) -> bool:
        return name in self._hashes

    def _token(self, name: str, password: str) -> bytes:
        return hmac.digest(self._key, f"{name}\0{password}".encode(), "sha256")

    def remembered(self, name: str, password: str) -> bool:
        """Whether the pair verified before (one HMAC: call it anywhere)."""
        if len(name) + len(password) > MAX_SECRET_CHARS:
            return False
        token = self._token(name, password)
        with self._lock:
            return token in self._verified

    def check(self, name: str, password: str) -> bool:
        """Whether ``password`` is ``name``'s. Slow (scrypt) for a pair not verified before:
        call it from a worker thread."""
        if len(name) + len(password) > MAX_SECRET_CHARS:
            return False
        if self.remembered(name, password):
            return True
        stored = self._hashes.get(name)
        if stored is None:
            scrypt(password, b"\0" * 16, *SCRYPT_COST)  # as costly as a known name's check
            return False
        if not password_matches(password, stored):
            return False
        with self._lock:
            self._verified.add(self._token(name, password))
        return True


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
