"""The operator's console: the ``console:`` section of ``tidings.yaml``.

The console is a web application with the power to resubmit and park events, so its
defaults are the safe ones: it listens on the loopback address, every page needs a login,
and a user may only look unless its role is ``operator``. Users are configured as the
streams' users are (:class:`~tidings.config.passwords.PasswordHashConfig`: the scrypt hash
of the password, or the variable holding it; never the password). Listening on another
address needs TLS, or an explicit ``plain_http_remote: true`` for a console behind a
TLS-terminating proxy on the same host's network.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from tidings.address import is_loopback
from tidings.config.listener import ListenerLimitsConfig
from tidings.config.login_throttle import LoginThrottleConfig
from tidings.config.model import (
    DAY,
    HOUR,
    RESOLVED_DEFAULT,
    SECOND,
    ZERO,
    Duration,
    LocalPath,
    parsed_durations,
    within,
)
from tidings.config.passwords import PasswordHashConfig
from tidings.config.tls import TlsServerConfig

ConsoleRole = Literal["read", "operator"]


class ConsoleUserConfig(PasswordHashConfig):
    """A user of the console: its password's hash and its role."""

    role: ConsoleRole = Field(
        default="read",
        description=(
            "``read``: every page, no action; ``operator``: also resubmit, park, unpark and "
            "re-drive events."
        ),
    )

    @model_validator(mode="after")
    def _needs_password(self) -> ConsoleUserConfig:
        if not self.has_password:
            raise ValueError("a console user needs password_hash or password_hash_env")
        return self


class ConsoleConfig(ListenerLimitsConfig, LoginThrottleConfig):
    """The operator's web console (``tidings console``, and a part of ``tidings run``); its
    port has the accept limits of every tidings listener (:mod:`tidings.config.listener`)."""

    host: str = Field(
        default="127.0.0.1",
        description="The address to listen on; the loopback address unless TLS is set.",
    )
    port: int = Field(default=8480, ge=1, le=65535, description="The port to listen on.")
    users: dict[str, ConsoleUserConfig] = Field(
        min_length=1, description="Who may log in, by name, with a password hash and a role."
    )
    tls: TlsServerConfig | None = Field(
        default=None, description="Serve HTTPS with this certificate (``ca_file`` is not used)."
    )
    plain_http_remote: bool = Field(
        default=False,
        description=(
            "Allow a non-loopback ``host`` without ``tls``: only behind a proxy that "
            "terminates TLS (passwords and session cookies would cross the network in clear)."
        ),
    )
    session_idle: Annotated[Duration, within(ZERO, DAY)] = Field(
        default=timedelta(minutes=30),
        description="A login ends after this long without a request.",
    )
    sample_every: Annotated[Duration, within(ZERO, 5 * 60 * SECOND)] = Field(
        default=timedelta(seconds=5),
        description="How often the console samples the outbox for its plots.",
    )
    history: Annotated[Duration, within(ZERO, 6 * HOUR)] = Field(
        default=timedelta(hours=1),
        description="How much of the sampled history the plots show (kept in memory).",
    )
    audit_file: LocalPath = Field(
        default="console-audit.sqlite",
        **RESOLVED_DEFAULT,
        description=(
            "The SQLite file of the audit trail (who did what to which events, and when); "
            "relative to the configuration file."
        ),
    )
    page_size: int = Field(default=50, ge=1, le=500, description="Events per page of a list.")

    _durations = parsed_durations("session_idle", "sample_every", "history")

    @field_validator("users")
    @classmethod
    def _user_names(cls, v: dict[str, ConsoleUserConfig]) -> dict[str, ConsoleUserConfig]:
        for name in v:
            if not name or len(name) > 64 or not name.isprintable() or name != name.strip():
                raise ValueError(f"console user name {name!r}: 1 to 64 printable characters")
        return v

    @model_validator(mode="after")
    def _safe_listen(self) -> ConsoleConfig:
        if not is_loopback(self.host) and self.tls is None and not self.plain_http_remote:
            raise ValueError(
                f"host {self.host!r} is not a loopback address: set tls (or, behind a proxy "
                "that terminates TLS, plain_http_remote: true)"
            )
        if self.history < self.sample_every:
            raise ValueError("history must be at least sample_every")
        return self

    @property
    def url(self) -> str:
        """Where the console is reached."""
        scheme = "https" if self.tls is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}/"
