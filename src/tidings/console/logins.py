"""Who is logged in to the console, and the tokens that prove a form came from its page.

Passwords are checked against the configured scrypt hashes by the
:class:`~tidings.config.passwords.PasswordBook` the streams and intermediaries use. A login
gets a random session token (the cookie's only content: nothing to sign, nothing to
decode) and a CSRF token of its own, which every form of its pages carries back. A client
address that fails too many logins is refused for a while before any password is hashed
(the intermediaries' :class:`~tidings.intermediary.serving.addresses.LoginThrottle`). Sessions
live in this process's memory: a restart of the console logs everyone out, and a session
ends after ``session_idle`` without a request, or at logout.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tidings.config.console import ConsoleConfig, ConsoleRole
from tidings.config.passwords import PasswordBook
from tidings.intermediary.serving.addresses import LoginThrottle

#: The most sessions kept at once; the oldest idle one goes first beyond it.
MAX_SESSIONS = 1_000


@dataclass
class Login:
    """One logged-in browser."""

    user: str
    role: ConsoleRole
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    seen: float = 0.0

    @property
    def may_act(self) -> bool:
        return self.role == "operator"

    def csrf_matches(self, given: str | None) -> bool:
        """Is ``given`` this session's CSRF token (compared in constant time)?"""
        return given is not None and hmac.compare_digest(given.encode(), self.csrf.encode())


class Logins:
    """The console's users and their sessions."""

    def __init__(
        self,
        hashes: Mapping[str, str],
        roles: Mapping[str, ConsoleRole],
        idle_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._book = PasswordBook(hashes)
        self._roles = dict(roles)
        self._idle_s = idle_s
        self._clock = clock
        self._sessions: dict[str, Login] = {}
        self._lock = threading.Lock()
        #: Failed logins per client address (the intermediaries' throttle), if configured.
        self.throttle: LoginThrottle | None = None

    @classmethod
    def of(cls, config: ConsoleConfig) -> Logins:
        """The users of ``config``; a hash named by a missing variable is a ConfigError
        naming it (read here, at start-up)."""
        hashes = {}
        for name, user in config.users.items():
            value = user.password_hash_of(f"console.users.{name}")
            assert value is not None, "a console user has a password (checked by the model)"
            hashes[name] = value
        roles = {name: user.role for name, user in config.users.items()}
        logins = cls(hashes, roles, config.session_idle.total_seconds())
        if config.max_failed_logins is not None:
            logins.throttle = LoginThrottle(
                config.max_failed_logins,
                config.failed_login_window.total_seconds(),
                config.failed_login_block.total_seconds(),
            )
        return logins

    def check(self, user: str, password: str) -> Login | None:
        """A new session for ``user`` if ``password`` is its own, else None. Slow (scrypt):
        call it from a worker thread."""
        if not self._book.check(user, password):
            return None
        login = Login(user, self._roles[user], seen=self._clock())
        with self._lock:
            if len(self._sessions) >= MAX_SESSIONS:
                oldest = min(self._sessions.values(), key=lambda s: s.seen)
                del self._sessions[oldest.token]
            self._sessions[login.token] = login
        return login

    def find(self, token: str | None) -> Login | None:
        """The live session of ``token`` (its idle time restarts), None if there is none."""
        if not token:
            return None
        now = self._clock()
        with self._lock:
            login = self._sessions.get(token)
            if login is None:
                return None
            if now - login.seen > self._idle_s:
                del self._sessions[token]
                return None
            login.seen = now
            return login

    def end(self, token: str | None) -> None:
        """Log the session of ``token`` out."""
        with self._lock:
            self._sessions.pop(token or "", None)
