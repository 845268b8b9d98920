"""The FTN18 streams' configuration: the ``streams:`` and ``stream_users:`` sections of the
event server's file, and the files of the streams' Spark jobs (aggregation).

The sections extend the server's own model (:class:`StreamServerConfig`), so one file
configures the event server and the streams it serves, and ``tidings server`` starts both.
Each stream is an HTTP and WebSocket endpoint (``host``, ``port``, ``path``; several streams
may share a port under different paths) carrying the event types its ``types`` map names
(checked by :mod:`.stream_types`). Users are shared by all streams; only password hashes are
configured (:mod:`.passwords`), directly or from an environment variable.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from tidings.config.listener import ListenerLimitsConfig
from tidings.config.model import (
    DAY,
    HOUR,
    MS,
    SECOND,
    ZERO,
    ParsedDuration,
    StrictModel,
    as_value_error,
    within,
)
from tidings.config.passwords import PasswordHashConfig
from tidings.config.server import ServerConfig, load_server_config, load_server_config_file
from tidings.config.stream_access import StreamGrant, check_grants
from tidings.config.stream_types import type_patterns


class StreamUserConfig(PasswordHashConfig):
    """A user of the streams: the scrypt hash of its password, or the variable holding it."""

    allow: list[StreamGrant] | None = Field(
        default=None,
        # Left out when unset, so a configuration dumped and read again (the relay's job
        # options, a JSON round trip) reads "everything" again, not the refused null.
        exclude_if=lambda value: value is None,
        description=(
            "What the user may do: streams, components, types, ``addEvent`` and a data filter "
            "per entry (see the security page). Left out: everything, as before permissions "
            "existed (unless ``stream_allow_required``); ``[]``: nothing."
        ),
    )

    @field_validator("allow", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        # Called only for a key present in the file: ``allow:`` with nothing after it is
        # YAML's null, and must not mean "everything".
        if value is None:
            raise ValueError(
                "allow is empty (null): write [] for a user that may do nothing, or leave the "
                "key out for one that may do everything"
            )
        return value

    @model_validator(mode="after")
    def _one_source(self) -> StreamUserConfig:
        if not self.has_password:
            raise ValueError("give exactly one of password_hash and password_hash_env")
        return self

    def resolved_hash(self, user: str) -> str:
        """The hash, read from the environment if configured so (at start-up)."""
        value = self.password_hash_of(f"stream_users.{user}")
        assert value is not None
        return value


class PushConfig(StrictModel):
    """How events are pushed over a WebSocket (``readyToReceive``)."""

    max_in_flight: int = Field(
        default=2,
        ge=1,
        le=64,
        description="onEvents calls sent before the first of them is answered.",
    )
    group_delay: Annotated[ParsedDuration, within(ZERO, SECOND, zero=True)] = Field(
        default=timedelta(milliseconds=2),
        description="How long new events wait for more to share their onEvents call.",
    )
    max_group_events: int = Field(
        default=1000,
        ge=1,
        le=1000,
        description="Events per onEvents call (FTN18 allows up to 1,000).",
    )
    live_queue_events: int = Field(
        default=10_000,
        ge=1,
        le=10_000_000,
        description=(
            "Events a live consumer may fall behind before its oldest waiting groups are skipped."
        ),
    )
    ack_timeout: Annotated[ParsedDuration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=30),
        description=(
            "A reliable consumer that leaves a group unanswered this long is disconnected (it gets"
            " the group again when it reconnects)."
        ),
    )


class RetentionConfig(StrictModel):
    """When a stream's events leave the active store (see
    :mod:`tidings.streams.consumers.retention`)."""

    enabled: bool = Field(
        default=False, description="Discard events the stream's consumers have all acknowledged."
    )
    min_age: Annotated[ParsedDuration, within(ZERO, 3650 * DAY, zero=True)] = Field(
        default=timedelta(days=1),
        description=(
            "Events younger than this stay, so that a re-published outbox event is still "
            "recognised by its stored copy (the store's duplicate window). A ``tidings.yaml`` "
            "refuses one shorter than the ``failover_resend`` of an ``event_server`` target "
            "publishing into the server."
        ),
    )
    every: Annotated[ParsedDuration, within(10 * MS, DAY, zero=True)] = Field(
        default=timedelta(seconds=10), description="How often a retention pass runs."
    )
    batch: int = Field(
        default=10_000, ge=1, le=1_000_000, description="Events deleted per transaction."
    )


class ConsumerEventsConfig(StrictModel):
    """The consumer events by which the servers of a group share their consumers' positions
    (see :mod:`tidings.streams.consumers.compaction`)."""

    compact_every: Annotated[ParsedDuration, within(10 * MS, DAY, zero=True)] = Field(
        default=timedelta(seconds=10),
        description=(
            "How often the consumer events that a later one supersedes are deleted (with or "
            "without stream retention): between passes, each acknowledgement that moved a "
            "consumer adds one."
        ),
    )


class StreamConfig(ListenerLimitsConfig):
    """One FTN18 stream (its port's accept limits with it: streams sharing a port give the
    same)."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="The stream's name: consumers' positions are kept under it.",
    )
    host: str = Field(
        default="127.0.0.1", description="The interface its HTTP and WebSocket endpoint listens on."
    )
    port: int = Field(
        ge=1, le=65535, description="Its port; streams may share a port under different paths."
    )
    path: str = Field(default="/", pattern=r"^/[A-Za-z0-9_./-]*$", description="Its URL path.")
    types: dict[str, list[Any]] = Field(
        description=(
            "FTN18 type name (1 to 16 of A-Z and _) -> one event type pattern "
            '(``[orders, OrderPlaced]``) or a list of them (``[[audit, "*"]]``); two names '
            "whose patterns one event could match are refused. ``addEvent`` can generate only a "
            "name whose single pattern has no wildcard."
        ),
    )
    push: PushConfig = Field(
        default=PushConfig(), description="How events are pushed over a WebSocket."
    )
    retention: RetentionConfig = Field(
        default=RetentionConfig(), description="When the stream's events leave the store."
    )
    max_request_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="The largest request a peer may send (FTN3's default limit is 64 KiB).",
    )
    tls_certfile: Path | None = Field(
        default=None, description="Serve TLS with this certificate chain and key (PEM files)."
    )
    tls_keyfile: Path | None = Field(default=None, description="The key of ``tls_certfile`` (PEM).")
    secure_channel: bool = Field(
        default=False,
        description=(
            "Treat plain connections as secure: the endpoint is reached only through a trusted "
            "channel (FutoIn's ``secureChannel``; its client says ``secure+ws://``)."
        ),
    )
    trust_proxy: bool = Field(
        default=False,
        description="Trust ``X-Forwarded-Proto: https`` from a TLS-terminating proxy in front.",
    )
    metrics: bool = Field(
        default=False,
        description=(
            "Export the stream's Prometheus metrics (consumer positions and lag) on the server's "
            "metrics endpoint (its ``metrics:`` section, on 127.0.0.1 by default), not on the "
            "stream's own port."
        ),
    )

    @field_validator("types")
    @classmethod
    def _types(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        as_value_error(type_patterns, value)
        return value

    @model_validator(mode="after")
    def _tls(self) -> StreamConfig:
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("give both tls_certfile and tls_keyfile, or neither")
        return self

    @property
    def endpoint(self) -> str:
        """The stream's URL."""
        scheme = "https" if self.tls_certfile else "http"
        return f"{scheme}://{self.host}:{self.port}{self.path}"


def _same_accept_limits(streams: list[StreamConfig]) -> None:
    """Streams sharing a host and port share its listener: they must give it the same
    ``max_connections_per_address`` and ``tls_handshake_timeout``."""
    first: dict[tuple[str, int], StreamConfig] = {}
    for stream in streams:
        other = first.setdefault((stream.host, stream.port), stream)
        keys = ("max_connections_per_address", "tls_handshake_timeout")
        if any(getattr(stream, key) != getattr(other, key) for key in keys):
            raise ValueError(
                f"streams {other.name} and {stream.name} share {stream.host}:{stream.port}, "
                "so they must give the same max_connections_per_address and "
                "tls_handshake_timeout (one listener)"
            )


class StreamServerConfig(ServerConfig):
    """The event server's configuration with the streams it serves."""

    stream_users: dict[str, StreamUserConfig] = Field(
        default_factory=dict, description="The users every stream accepts, by name."
    )
    streams: list[StreamConfig] = Field(
        default_factory=list, description="The FTN18 streams the server serves."
    )
    stream_consumer_events: ConsumerEventsConfig = Field(
        default=ConsumerEventsConfig(),
        description=(
            "The events that share the streams' consumers and their positions with the other "
            "servers of a redundant group."
        ),
    )
    stream_allow_required: bool = Field(
        default=False,
        description=(
            "Every stream user needs an ``allow`` list: a user without one is a configuration "
            "error, instead of a user that may do everything."
        ),
    )

    @model_validator(mode="after")
    def _streams(self) -> StreamServerConfig:
        names = [s.name for s in self.streams]
        if len(names) != len(set(names)):
            raise ValueError("streams: two streams have the same name")
        endpoints = [(s.host, s.port, s.path.rstrip("/")) for s in self.streams]
        if len(endpoints) != len(set(endpoints)):
            raise ValueError("streams: two streams have the same host, port and path")
        _same_accept_limits(self.streams)
        for user in self.stream_users:
            if not user or ":" in user or user.startswith("-"):
                raise ValueError(
                    f"stream_users: {user!r} is not a user name (no ':', no '-' first)"
                )
        if self.streams and not self.stream_users:
            raise ValueError("streams need at least one entry under stream_users")
        for index, stream in enumerate(self.streams):
            if stream.metrics and self.metrics is None:
                raise ValueError(
                    f"streams.{index}.metrics: a stream's metrics are served on the server's "
                    "metrics endpoint, and this server has none: add metrics: {port: PORT} "
                    "(it listens on 127.0.0.1 unless metrics.address says otherwise)"
                )
        unrestricted = self.unrestricted_users()
        if self.stream_allow_required and unrestricted:
            raise ValueError(
                f"stream_users: no allow list for {', '.join(unrestricted)}, and "
                "stream_allow_required is set (give each user its allow list)"
            )
        grants = {name: user.allow for name, user in self.stream_users.items()}
        types = {stream.name: type_patterns(stream.types) for stream in self.streams}
        as_value_error(lambda _: check_grants(grants, types), None)
        return self

    def unrestricted_users(self) -> list[str]:
        """The stream users without an ``allow`` list: they may do everything."""
        return [name for name, user in self.stream_users.items() if user.allow is None]

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

    url: str = Field(pattern=r"^(https?|wss?)://", description="The stream's URL.")
    user: str = Field(min_length=1, description="The user the job calls as.")
    password_env: str = Field(
        min_length=1,
        description="The variable holding the password (passwords are not written in files).",
    )
    component: str = Field(
        pattern=r"^[A-Za-z0-9_]{1,16}$",
        description="The consumer component the job registers as (not ``LIVE``).",
    )
    want: list[str] | None = Field(default=None, description="Only these FTN18 types (None: all).")

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

    database: str = Field(min_length=1, description="The store's database URL.")
    server_id: int = Field(
        default=1, ge=1, description="The server id the aggregated events are registered with."
    )
    type_prefix: list[str] = Field(
        default_factory=lambda: ["aggregate"],
        description=(
            "An event of source ``s`` and FTN18 type ``T`` is stored as ``(*type_prefix, s, T)``."
        ),
    )


class AggregateConfig(StrictModel):
    """``tidings streams aggregate -c FILE``: FTN18 2.3.3's aggregation of partitioned streams."""

    sources: dict[str, StreamSourceConfig] = Field(
        description="The streams aggregated, by source name."
    )
    destination: AggregateDestination = Field(
        description="The event store they are aggregated into."
    )
    checkpoint_dir: str = Field(
        default=".tidings/aggregate", description="The streaming query's checkpoint."
    )
    trigger_interval: Annotated[ParsedDuration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=1), description="How often a micro-batch starts."
    )
    spark_master: str = Field(default="local[*]", description="Spark's master URL.")

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


__all__ = [
    "AggregateConfig",
    "AggregateDestination",
    "ConsumerEventsConfig",
    "PushConfig",
    "RetentionConfig",
    "StreamConfig",
    "StreamGrant",
    "StreamServerConfig",
    "StreamSourceConfig",
    "StreamUserConfig",
    "load_stream_server_config",
    "load_stream_server_config_file",
]
