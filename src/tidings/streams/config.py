"""Configuration of FTN18 streams: the ``streams:`` and ``stream_users:`` sections of the
event server's configuration.

They extend the server's own model (:class:`StreamServerConfig`), so one file configures the
event server and the streams it serves, and ``tidings server`` starts both. Each stream is an
HTTP and WebSocket endpoint (``host``, ``port``, ``path``; several streams may share a port
under different paths) carrying the event types its ``types`` map names. Users are shared by
all streams; only password hashes are configured, directly or from an environment variable.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator, model_validator

from tidings.config import StrictModel, parse_duration
from tidings.errors import ConfigError
from tidings.server.config import ServerConfig, load_server_config, load_server_config_file
from tidings.streams.auth import check_hash
from tidings.streams.typemap import TypeMap, type_map_from_config

Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


class StreamUserConfig(StrictModel):
    """A user of the streams: the scrypt hash of its password, or the variable holding it."""

    password_hash: str | None = None
    password_hash_env: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> StreamUserConfig:
        if (self.password_hash is None) == (self.password_hash_env is None):
            raise ValueError("give exactly one of password_hash and password_hash_env")
        if self.password_hash is not None:
            _as_value_error(check_hash, self.password_hash)
        return self

    def resolved_hash(self, user: str) -> str:
        """The hash, read from the environment if configured so (at start-up)."""
        if self.password_hash is not None:
            return self.password_hash
        assert self.password_hash_env is not None
        value = os.environ.get(self.password_hash_env)
        if not value:
            raise ConfigError(
                f"stream_users.{user}.password_hash_env: the variable "
                f"{self.password_hash_env} is not set"
            )
        try:
            return check_hash(value)
        except ConfigError as exc:
            raise ConfigError(f"stream_users.{user} ({self.password_hash_env}): {exc}") from None


class PushConfig(StrictModel):
    """How events are pushed over a WebSocket (``readyToReceive``)."""

    #: onEvents calls sent before the first of them is answered.
    max_in_flight: int = Field(default=2, ge=1, le=64)
    #: How long new events wait for more to share their onEvents call.
    group_delay: Duration = timedelta(milliseconds=2)
    #: Events per onEvents call (FTN18 allows up to 1,000).
    max_group_events: int = Field(default=1000, ge=1, le=1000)
    #: Events a live consumer may fall behind before its oldest waiting groups are skipped.
    live_queue_events: int = Field(default=10_000, ge=1)
    #: A reliable consumer that leaves a group unanswered this long is disconnected (it
    #: gets the group again when it reconnects).
    ack_timeout: Duration = timedelta(seconds=30)


class RetentionConfig(StrictModel):
    """When a stream's events leave the active store (see :mod:`tidings.streams.retention`)."""

    enabled: bool = False
    #: Events younger than this stay, so that a re-published outbox event is still
    #: recognised by its stored copy (the store's duplicate window).
    min_age: Duration = timedelta(days=1)
    #: How often a retention pass runs.
    every: Duration = timedelta(seconds=10)
    #: Events deleted per transaction.
    batch: int = Field(default=10_000, ge=1, le=1_000_000)


class StreamConfig(StrictModel):
    """One FTN18 stream."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    path: str = Field(default="/", pattern=r"^/[A-Za-z0-9_./-]*$")
    #: FTN18 type name -> one event type pattern, or a list of them.
    types: dict[str, list[Any]]
    push: PushConfig = PushConfig()
    retention: RetentionConfig = RetentionConfig()
    #: The largest request a peer may send (FTN3's default limit is 64 KiB).
    max_request_bytes: int = Field(default=64 * 1024, ge=1024, le=64 * 1024 * 1024)
    #: Serve TLS with this certificate chain and key (PEM files).
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    #: Treat plain connections as secure: the endpoint is reached only through a trusted
    #: channel (FutoIn's ``secureChannel``; its client says ``secure+ws://``).
    secure_channel: bool = False
    #: Trust ``X-Forwarded-Proto: https`` from a TLS-terminating proxy in front.
    trust_proxy: bool = False
    #: Serve Prometheus metrics at ``<path>/metrics`` (consumer positions and lag).
    metrics: bool = False

    @field_validator("types")
    @classmethod
    def _types(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        _as_value_error(type_map_from_config, value)
        return value

    @model_validator(mode="after")
    def _tls(self) -> StreamConfig:
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("give both tls_certfile and tls_keyfile, or neither")
        return self

    def type_map(self) -> TypeMap:
        return type_map_from_config(self.types)

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.tls_certfile else "http"
        return f"{scheme}://{self.host}:{self.port}{self.path}"


class StreamServerConfig(ServerConfig):
    """The event server's configuration with the streams it serves."""

    stream_users: dict[str, StreamUserConfig] = Field(default_factory=dict)
    streams: list[StreamConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _streams(self) -> StreamServerConfig:
        names = [s.name for s in self.streams]
        if len(names) != len(set(names)):
            raise ValueError("streams: two streams have the same name")
        endpoints = [(s.host, s.port, s.path.rstrip("/")) for s in self.streams]
        if len(endpoints) != len(set(endpoints)):
            raise ValueError("streams: two streams have the same host, port and path")
        for user in self.stream_users:
            if not user or ":" in user or user.startswith("-"):
                raise ValueError(
                    f"stream_users: {user!r} is not a user name (no ':', no '-' first)"
                )
        if self.streams and not self.stream_users:
            raise ValueError("streams need at least one entry under stream_users")
        return self

    def resolved(self) -> StreamServerConfig:
        """TLS paths made absolute against the configuration file's directory."""
        streams = [
            s.model_copy(
                update={
                    "tls_certfile": s.tls_certfile and self.resolve(s.tls_certfile),
                    "tls_keyfile": s.tls_keyfile and self.resolve(s.tls_keyfile),
                }
            )
            for s in self.streams
        ]
        return self.model_copy(update={"streams": streams})


class StreamSourceConfig(StrictModel):
    """A stream a Spark job consumes as a registered consumer."""

    url: str = Field(pattern=r"^(https?|wss?)://")
    user: str = Field(min_length=1)
    #: The variable holding the password (passwords are not written in files).
    password_env: str = Field(min_length=1)
    component: str = Field(pattern=r"^[A-Za-z0-9_]{1,16}$")
    want: list[str] | None = None

    @field_validator("component")
    @classmethod
    def _registrable(cls, value: str) -> str:
        if value == "LIVE":
            raise ValueError("LIVE cannot be registered: a job consumes as a reliable consumer")
        return value

    def options(self) -> dict[str, str]:
        """The ``tidings_stream`` source options."""
        options = {
            "url": self.url,
            "user": self.user,
            "password_env": self.password_env,
            "component": self.component,
        }
        if self.want is not None:
            options["want"] = ",".join(self.want)
        return options


class AggregateDestination(StrictModel):
    """The event store the aggregated stream lives in (a tidings server serves it)."""

    database: str = Field(min_length=1)
    server_id: int = Field(default=1, ge=1)
    type_prefix: list[str] = Field(default_factory=lambda: ["aggregate"])


class AggregateConfig(StrictModel):
    """``tidings streams aggregate -c FILE``: FTN18 2.3.3's aggregation of partitioned streams."""

    sources: dict[str, StreamSourceConfig]
    destination: AggregateDestination
    checkpoint_dir: str = ".tidings/aggregate"
    trigger_interval: Duration = timedelta(seconds=1)
    spark_master: str = "local[*]"

    @field_validator("sources")
    @classmethod
    def _names(cls, value: dict[str, StreamSourceConfig]) -> dict[str, StreamSourceConfig]:
        if not value:
            raise ValueError("give at least one source")
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
                raise ValueError(f"source name {name!r}: use 1-64 of letters, digits, _ . -")
        return value


def load_stream_server_config(data: Any, base_dir: Path | None = None) -> StreamServerConfig:
    """Validate a server configuration that may hold streams."""
    config = load_server_config(data, base_dir, model=StreamServerConfig)
    assert isinstance(config, StreamServerConfig)
    return config.resolved()


def load_stream_server_config_file(path: str | Path | None = None) -> StreamServerConfig:
    """Load a server configuration file that may hold streams (default path as the server's)."""
    config = load_server_config_file(path, model=StreamServerConfig)
    assert isinstance(config, StreamServerConfig)
    return config.resolved()


def _as_value_error(check: Any, value: Any) -> Any:
    """Run a check that raises ConfigError inside a pydantic validator (which reports
    ValueErrors with the key path)."""
    try:
        return check(value)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


__all__ = [
    "AggregateConfig",
    "AggregateDestination",
    "PushConfig",
    "RetentionConfig",
    "StreamConfig",
    "StreamServerConfig",
    "StreamSourceConfig",
    "StreamUserConfig",
    "load_stream_server_config",
    "load_stream_server_config_file",
]
