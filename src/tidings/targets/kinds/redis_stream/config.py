"""The configuration of a Redis Streams target: its server, streams, trimming and security.

Checked when the configuration is read: a URL that is not ``redis://`` or ``rediss://``,
a password written into the URL (it belongs in the environment, ``password_env``), a
stream template with an unknown placeholder, a TLS file that is not there.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from tidings.config import HOUR, ZERO, Duration, TargetConfig, parsed_durations, within
from tidings.config.tls import TlsClientConfig
from tidings.targets.destination import DestinationTemplate
from tidings.targets.secrets import ENV_NAME


def stream_value_problem(value: str) -> str | None:
    """Why a placeholder's value cannot stand in a stream name (None if it can): Redis keys
    are any bytes, but an empty value would silently merge streams."""
    return "empty, and a part of a stream name cannot be" if not value else None


def stream_template(text: str) -> DestinationTemplate:
    """A ``stream`` template parsed (ValueError if it is bad)."""
    return DestinationTemplate(text, stream_value_problem)


class RedisStreamTargetConfig(TargetConfig):
    """Redis Streams: every event is an ``XADD`` to the stream its ``stream`` template names."""

    kind: Literal["redis_stream"] = Field(description="The target's kind: ``redis_stream``.")
    url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description=(
            "The server: ``redis://HOST:PORT/DB``, or ``rediss://`` for TLS. No password here: "
            "``username`` and ``password_env`` give the ACL user."
        ),
    )
    stream: str = Field(
        min_length=1,
        description=(
            "The stream (the Redis key) each event is added to, a destination template: "
            "``orders`` for one stream, ``orders:{event_type}`` or "
            "``tenant:{headers.tenant}:events`` for one per value."
        ),
    )
    maxlen: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Trim each stream to about this many entries as it is added to (``MAXLEN ~``); "
            "None: never trim. Trimming does not wait for consumer groups to read."
        ),
    )
    maxlen_approximate: bool = Field(
        default=True,
        description=(
            "``MAXLEN ~`` (true: Redis trims whole nodes, much cheaper) or an exact ``MAXLEN``."
        ),
    )
    username: str | None = Field(
        default=None, min_length=1, description="The ACL user (None: ``default``)."
    )
    password_env: str | None = Field(
        default=None,
        pattern=ENV_NAME,
        description=(
            "The environment variable holding the password (of ``username``, or the "
            "``requirepass`` of ``default``), read at each connection."
        ),
    )
    tls: TlsClientConfig | None = Field(
        default=None,
        description=(
            "TLS settings for a ``rediss://`` URL: the CA that signed the server's certificate "
            "(absent: the system's CAs) and a client certificate for servers that verify "
            "clients (``tls-auth-clients yes``)."
        ),
    )
    timeout: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=5),
        description="How long connecting, and waiting for one round of replies, may take.",
    )

    _durations = parsed_durations("timeout")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"{v!r} is not a redis:// or rediss:// URL")
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "the URL holds a user or password: give username and password_env instead "
                "(a password in the file travels with it)"
            )
        if not parts.hostname:
            raise ValueError(f"{v!r} names no host")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ValueError(f"{v!r}: {exc}") from None
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise ValueError(f"{v!r}: the database after the host must be a number")
        if parts.query or parts.fragment:
            raise ValueError(f"{v!r}: options in the URL are not read; use the target's keys")
        return v

    @field_validator("stream")
    @classmethod
    def _stream(cls, v: str) -> str:
        stream_template(v)
        return v

    @model_validator(mode="after")
    def _tls_with_rediss(self) -> RedisStreamTargetConfig:
        if self.tls is not None and not self.url.startswith("rediss://"):
            raise ValueError("tls is set but the url is not rediss:// (TLS is for rediss://)")
        return self

    @property
    def secure(self) -> bool:
        return self.url.startswith("rediss://")
