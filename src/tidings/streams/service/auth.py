"""FTN8 basic authentication of stream callers against the configured users.

The FutoIn client's simplest mode sends ``"sec": "user:password"`` with every request. The
configuration keeps only scrypt hashes of the passwords, and a pair that verified once is
remembered so that later requests cost one HMAC (:class:`tidings.config.passwords.PasswordBook`,
which the intermediaries' subscribers are checked by too); a wrong password is checked in full
every time.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidings.config.passwords import MAX_SECRET_CHARS, PasswordBook
from tidings.errors import StreamError
from tidings.streams.protocol.ftn3 import SECURITY_ERROR


class Users:
    """The users a stream server accepts: name -> password hash."""

    def __init__(self, hashes: Mapping[str, str]) -> None:
        self._book = PasswordBook(hashes)

    def remembered(self, sec: str | None) -> str | None:
        """The user of ``sec`` if that pair verified before (one HMAC: call it anywhere)."""
        if sec is None:
            return None
        user, _, password = sec.partition(":")
        return user if self._book.remembered(user, password) else None

    def authenticate(self, sec: str | None) -> str:
        """The user named by an FTN8 basic ``sec`` (``user:password``); SecurityError if
        there is none, the mode is not basic, or the password is wrong. Slow (scrypt) for
        a pair not verified before: call it from a worker thread."""
        if sec is None:
            raise StreamError(SECURITY_ERROR, "Anonymous not allowed: send sec user:password")
        if len(sec) > MAX_SECRET_CHARS:
            raise StreamError(SECURITY_ERROR, "sec is too long")
        user, colon, password = sec.partition(":")
        if not colon or not user or user.startswith("-") or ":" in password:
            raise StreamError(
                SECURITY_ERROR, "only FTN8 basic authentication (sec = user:password) is enabled"
            )
        if not self._book.check(user, password):
            raise StreamError(SECURITY_ERROR, "Basic Auth Verification Failed")
        return user
