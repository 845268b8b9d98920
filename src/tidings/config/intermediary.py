"""The ``intermediary:`` section of ``tidings.yaml``: what ``tidings intermediary serve``
listens on (with TLS, :mod:`.tls`), who may subscribe to what (:mod:`.intermediary_access`),
the event server it follows, the domain tables its SQL views read, its bounds, and an
optional spatial upstream.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from tidings.address import is_tls, parse_address
from tidings.config.intermediary_access import SubscriberAccess, check_corners
from tidings.config.listener import ListenerLimitsConfig
from tidings.config.login_throttle import LoginThrottleConfig
from tidings.config.metrics import MetricsListenConfig
from tidings.config.model import (
    HOUR,
    SECOND,
    ZERO,
    Duration,
    StrictModel,
    parsed_durations,
    within,
)
from tidings.config.tls import TlsClientConfig, TlsServerConfig
from tidings.errors import ConfigError

_SQL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The kinds a column of an intermediary's table may declare (those of its SQL views).
ColumnKind = Literal["integer", "real", "numeric", "text", "blob"]


def _host_port(value: str) -> str:
    """``HOST:PORT`` (an IPv6 host in brackets), port 0-65535; 0 is any free port."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, e.g. 127.0.0.1:8100, got {value!r}")
    return value


def tls_connect_options(url: str, tls: TlsClientConfig | None) -> dict[str, Any]:
    """The ``ssl`` (and ``server_hostname``) keyword arguments of a ``websockets`` connection
    to ``url``: none for ``ws://``; for ``wss://``, ``tls``'s (absent: verified against the
    system's CAs)."""
    if not url.startswith("wss://"):
        return {}
    tls = tls or TlsClientConfig()
    options: dict[str, Any] = {"ssl": tls.context()}
    if tls.server_name is not None:
        options["server_hostname"] = tls.server_name
    return options


class IntermediaryTableConfig(StrictModel):
    """A domain table an intermediary's SQL views may read, fed by its row-change events
    (``rows.<table>``, :mod:`tidings.intermediary.views.rows`): its columns (name -> kind, or null
    for a column of unknown kind) and the column its rows are keyed by, or the columns in
    order. (Not ``key``: ``tidings config check`` masks keys so named, as secrets.)"""

    columns: dict[str, ColumnKind | None] = Field(
        min_length=1,
        description=(
            "Column name -> its kind (null: a column of unknown kind); views see only these "
            "columns."
        ),
    )
    keyed_by: str | list[str] = Field(
        description="The column the table's rows are keyed by, or the columns in order."
    )

    @field_validator("columns")
    @classmethod
    def _column_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if not _SQL_NAME.fullmatch(name):
                raise ValueError(f"column name {name!r} must be a SQL name (letters, digits, _)")
        return v

    @model_validator(mode="after")
    def _key_is_a_column(self) -> IntermediaryTableConfig:
        keys = [self.keyed_by] if isinstance(self.keyed_by, str) else self.keyed_by
        if not keys:
            raise ValueError("keyed_by: name at least one column")
        for column in keys:
            if column not in self.columns:
                raise ValueError(
                    f"keyed_by: {column!r} is not one of the columns ({', '.join(self.columns)})"
                )
        return self


class IntermediaryLimitsConfig(ListenerLimitsConfig, LoginThrottleConfig):
    """Bounds of ``tidings intermediary serve``: at accept (the keys every listener has:
    ``max_connections_per_address``, ``tls_handshake_timeout``), per server, per connection,
    per view."""

    max_connections: int = Field(
        default=10_000,
        gt=0,
        le=1_000_000,
        description="Subscribers connected at once; one more is closed with code 1013.",
    )
    max_queued_messages: int = Field(
        default=10_000,
        gt=0,
        le=10_000_000,
        description=(
            "Event and status messages the one ring of events every subscriber reads holds "
            "from earlier ticks (an event is held once, whoever subscribed); past this the "
            "oldest are dropped, and a subscriber that lost one of its own is too slow and is "
            "disconnected (close code 4008, with the reason)."
        ),
    )
    max_queued_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=64 * 1024,
        le=2**34,
        description=(
            "The bytes the ring of events holds; past them the oldest are dropped, and a "
            "subscriber that lost one of its own is too slow and is disconnected (close code "
            "4008, with the reason). What subscribers that never read cost together, whatever "
            "their number: this, once, plus their sockets' buffers. Keep it above the largest "
            "burst the intermediary receives in one tick."
        ),
    )
    max_request_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="The largest request a subscriber may send, in bytes.",
    )
    requests_per_s: float = Field(
        default=20.0,
        gt=0,
        le=1_000_000,
        description="Requests per second a subscriber may send in the long run (a token bucket).",
    )
    request_burst: int = Field(
        default=40,
        gt=0,
        le=1_000_000,
        description="Requests a subscriber may send at once above that rate (the bucket's size).",
    )
    max_subscriptions_per_subscriber: int = Field(
        default=64,
        gt=0,
        le=100_000,
        description="Event and SQL-view subscriptions one connection may hold.",
    )
    max_view_rows: int = Field(
        default=10_000,
        gt=0,
        le=10_000_000,
        description="The LIMIT of a view without one, and the highest LIMIT accepted.",
    )
    view_workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description=(
            "Threads evaluating SQL views. A subscriber has one evaluation under way at a "
            "time, so views that run to their bounds hold at most this many threads and the "
            "other views go on in the rest; each thread keeps its own copy of the tables."
        ),
    )
    view_timeout: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=5), description="How long one evaluation of a view may take."
    )

    _durations = parsed_durations("view_timeout")


class IntermediarySpatialConfig(StrictModel):
    """A spatial upstream for ``tidings intermediary serve``: a publisher of moving entities
    speaking the spatial feed protocol (``tidings intermediary simulate``, or your own, see
    :mod:`tidings.intermediary.feed.remote`), so ``region`` subscriptions are served too."""

    upstream: str = Field(
        description=(
            "Where the publisher listens: ``ws://HOST:PORT/``, or ``wss://`` over TLS (a lost "
            "connection is ridden out: the intermediary reconnects to it)."
        )
    )
    tls: TlsClientConfig | None = Field(
        default=None,
        description=(
            "With a ``wss://`` upstream: how its certificate is verified and the client "
            "certificate to present (absent: verified against the system's CAs)."
        ),
    )
    world_lo: list[float] = Field(
        min_length=2,
        max_length=3,
        description=(
            "The world's lowest corner (2 or 3 numbers): regions are clipped to the world upstream."
        ),
    )
    world_hi: list[float] = Field(
        min_length=2,
        max_length=3,
        description="The world's highest corner, with as many numbers as ``world_lo``.",
    )
    margin: float = Field(
        default=10.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            "How far past a region the intermediary asks upstream (claim 2's neighbourhood), so a "
            "moving view stays covered for a while."
        ),
    )

    @field_validator("upstream")
    @classmethod
    def _ws_url(cls, v: str) -> str:
        if not v.startswith(("ws://", "wss://")):
            raise ValueError(f"expected a ws:// or wss:// URL of the spatial publisher, got {v!r}")
        return v

    @model_validator(mode="after")
    def _tls_needs_wss(self) -> IntermediarySpatialConfig:
        if self.tls is not None and not self.upstream.startswith("wss://"):
            raise ValueError(
                f"tls: the upstream {self.upstream} is not wss://; TLS settings would be unused"
            )
        return self

    def connect_options(self) -> dict[str, Any]:
        """The TLS keyword arguments of the connection to the publisher (none for ws://)."""
        return tls_connect_options(self.upstream, self.tls)

    @model_validator(mode="after")
    def _world(self) -> IntermediarySpatialConfig:
        check_corners(self.world_lo, self.world_hi, ("world_lo", "world_hi"))
        return self


class IntermediaryConfig(SubscriberAccess):
    """``tidings intermediary serve``: an intermediary whose upstream is an event server,
    serving event and SQL-view subscriptions over WebSocket."""

    listen: Annotated[str, AfterValidator(_host_port)] = Field(
        default="127.0.0.1:8100",
        description=(
            "``HOST:PORT`` of its WebSocket endpoint and web page; 0.0.0.0 exposes every interface."
        ),
    )
    tls: TlsServerConfig | None = Field(
        default=None,
        description=(
            "Serve the WebSocket and the pages over TLS (``wss://``, ``https://``) with this "
            "certificate and key (absent: plaintext)."
        ),
    )
    event_server: str | list[str] = Field(
        default="tcp+sbs://127.0.0.1:23012",
        description=(
            "The Eventer address (``tcp+sbs://`` or ``ssl+sbs://``) of the event server it "
            "follows, or the addresses of the "
            "servers of a redundant group: it connects to one, and when that connection is "
            "lost it serves its last state marked stale and reconnects, trying them in turn."
        ),
    )
    event_server_tls: TlsClientConfig | None = Field(
        default=None,
        description=(
            "For event servers at ``ssl+sbs://`` addresses: the CA their certificates are "
            "checked against (absent: the system's CAs) and the client certificate presented "
            "to a server with mutual TLS (its CN is the intermediary's identity there)."
        ),
    )
    row_type_prefix: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description=(
            "The ``type_prefix`` of the event server target the row events reach it through: "
            "the rows of table ``t`` are events ``[*prefix, 'rows.t']``."
        ),
    )
    tables: dict[str, IntermediaryTableConfig] = Field(
        default_factory=dict, description="The domain tables its SQL views may read, by name."
    )
    tick: Annotated[Duration, within(ZERO, 10 * SECOND)] = Field(
        default=timedelta(milliseconds=20),
        description="How often it takes what the event server sent and serves its subscribers.",
    )
    request_timeout: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=30),
        description=(
            "How long a request to the event server (a subscription, a table's load) may take."
        ),
    )
    limits: IntermediaryLimitsConfig = Field(
        default=IntermediaryLimitsConfig(),
        description="Bounds per server, per connection and per view.",
    )
    spatial: IntermediarySpatialConfig | None = Field(
        default=None,
        description=(
            "A spatial upstream besides the event server (None: region subscriptions are refused)."
        ),
    )
    metrics: MetricsListenConfig = Field(
        default=MetricsListenConfig(),
        description=(
            "Its Prometheus metrics at ``http://ADDRESS:PORT/metrics`` (no port: no endpoint; "
            "on 127.0.0.1 unless ``address`` says otherwise)."
        ),
    )

    _durations = parsed_durations("tick", "request_timeout")

    @field_validator("event_server")
    @classmethod
    def _addresses(cls, v: str | list[str]) -> str | list[str]:
        """Each a ``tcp+sbs://HOST:PORT`` or ``ssl+sbs://HOST:PORT`` address (one error line
        for a bad one, whichever form), at least one, none twice."""
        addresses = [v] if isinstance(v, str) else v
        if not addresses:
            raise ValueError("give at least one address")
        for address in addresses:
            try:
                parse_address(address)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
            if addresses.count(address) > 1:
                raise ValueError(f"{address} is listed twice")
        return v

    @model_validator(mode="after")
    def _event_server_tls(self) -> IntermediaryConfig:
        if self.event_server_tls is not None and not any(map(is_tls, self.event_servers)):
            raise ValueError("event_server_tls is set, but no event_server address is ssl+sbs://")
        return self

    @model_validator(mode="after")
    def _metrics_port(self) -> IntermediaryConfig:
        listen_port = int(self.listen.rpartition(":")[2])
        if self.metrics.port is not None and self.metrics.port == listen_port:
            raise ValueError(
                f"metrics.port: {self.metrics.port} is also the port of listen "
                f"({self.listen}); give /metrics a port of its own"
            )
        return self

    @property
    def event_servers(self) -> list[str]:
        """The addresses of ``event_server``, as a list."""
        return [self.event_server] if isinstance(self.event_server, str) else self.event_server

    @model_validator(mode="after")
    def _granted_tables(self) -> IntermediaryConfig:
        self.check_tables(list(self.tables))
        return self

    @field_validator("tables")
    @classmethod
    def _table_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        lowered = [name.lower() for name in v]
        for name in v:
            if not _SQL_NAME.fullmatch(name):
                raise ValueError(f"table name {name!r} must be a SQL name (letters, digits, _)")
            if lowered.count(name.lower()) > 1:
                raise ValueError(f"table {name!r} is listed twice (names are case-insensitive)")
        return v
