"""The event server's file (``tidings server --conf``): hat-event 0.8.5's server.yaml, plus
a peer list. It is a file of its own, separate from ``tidings.yaml``, for now; the streams the
server serves are sections of it too (:mod:`tidings.config.streams` extends this model).

The document's keys keep their meaning (``type``, ``log``, ``backend``, ``engine``,
``eventer_server``, ``syncer_server``, ``syncer_token``, ``monitor``), so a hat-event
configuration moves over by changing the backend module. Redundant servers find each other
through a Hat Monitor Server as in hat-event (``monitor``, see :mod:`tidings.server.monitor`)
or, where there is no Monitor, from a static list (``syncer_peers``); one server uses one of
the two. tidings' own tuning keys (frame and lag limits, session bound) have defaults.

Relative paths (the SQLite backend's ``db_path``, the TLS files) are relative to the
configuration file's directory, so a configuration works the same from any working directory.

TLS (:mod:`.tls`) is hat-event's ``ssl+sbs://`` scheme on the Eventer and Syncer addresses,
with tidings' ``tls`` keys beside them: the certificate and key the server presents, and a
CA whose certificates clients must present (mutual TLS); ``syncer_client.tls`` says how the
Syncer checks its peers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tidings.address import Address, MonitorAddress, is_tls
from tidings.config.eventer_access import EventerAnonymousConfig, EventerIdentityConfig
from tidings.config.listener import ListenerLimitsConfig
from tidings.config.loading import read_config_data, validate_config
from tidings.config.log_retention import LogRetentionConfig
from tidings.config.model import StrictModel, resolve_path
from tidings.config.tls import TlsClientConfig, TlsServerConfig
from tidings.errors import ConfigError

DEFAULT_EVENTER_ADDRESS = "tcp+sbs://127.0.0.1:23012"
DEFAULT_SYNCER_ADDRESS = "tcp+sbs://127.0.0.1:23013"
#: Names tried, in order, in ``$XDG_CONFIG_HOME/tidings/`` when no ``--conf`` is given.
DEFAULT_CONFIG_NAMES = ("event.yaml", "event.yml", "event.json")

#: Unsent bytes after which an Eventer client is dropped as a slow subscriber.
DEFAULT_MAX_SUBSCRIBER_LAG_BYTES = 16 * 1024 * 1024
#: The largest frame an Eventer client may send. Measured needs: a hat client's batch of 100
#: events is ~4 KB; the relay's event_server target sends a whole batch of a Spark task in one
#: call, ~126 bytes per event with the relay benchmark's payloads (50,000 events: 6 MiB,
#: 100,000: 12 MiB); a query for 3,000 types is 53 KB, for 10,000 ids 80 KB. A frame at the
#: limit decodes into at most 8 M values (see tidings.wire.prescan), about half a gigabyte.
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024


class BackendConfig(BaseModel):
    """``backend``: the Python module that stores events, that module's own keys, and when
    a registration is answered (``durability``, ``flush_period``: hat-event's lmdb backend
    key, with its meaning)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    module: str = Field(
        min_length=1,
        description=(
            "The backend's Python module (``tidings.server.backends.sqlite``, ``...postgresql``)."
        ),
    )
    durability: Literal["commit", "periodic"] = Field(
        default="commit",
        description=(
            "``commit``: answer a registration once committed. ``periodic``: answer once written "
            "into the open transaction, commit at most ``flush_period`` later (a crash loses the "
            "sessions since the last commit, whole and at the end; see the event store's design "
            "notes)."
        ),
    )
    flush_period: float = Field(
        default=1.0,
        gt=0,
        le=10,
        description=(
            "Seconds between commits with ``durability: periodic`` (hat-event's default: 1). At "
            "most 10: on SQLite other writers (stream acks, other processes) may wait that long "
            "for the held write lock, well within their 30-s busy timeout."
        ),
    )

    def options(self) -> dict[str, Any]:
        """The backend module's own keys (not ``module``, ``durability``, ``flush_period``)."""
        return dict(self.model_extra or {})

    @property
    def held_flush_period(self) -> float | None:
        """The flush period if registrations are held between commits, else None."""
        return self.flush_period if self.durability == "periodic" else None


class ModuleConfig(BaseModel):
    """One entry of ``engine.modules``: a Python module path and that module's own keys."""

    model_config = ConfigDict(extra="allow", frozen=True)

    module: str = Field(
        min_length=1,
        description=(
            "The engine module's Python module path: a hat-event 0.8.5 module (its own "
            "schema then validates the entry) or a tidings module."
        ),
    )

    def as_dict(self) -> dict[str, Any]:
        """The whole entry, ``module`` included, as hat-event hands it to ``create``."""
        return {"module": self.module, **(self.model_extra or {})}


class EngineConfig(StrictModel):
    """``engine``: the server's id and the modules that run in each session."""

    server_id: int = Field(
        ge=1,
        le=2**63 - 1,
        description="This server's id: the first part of the ids of the events it registers.",
    )
    modules: list[ModuleConfig] = Field(
        default_factory=list,
        description=(
            "Engine modules, run in this order in every session; a module's source id is "
            "its index here (see the Engine modules guide)."
        ),
    )
    max_session_events: int = Field(
        default=10_000,
        ge=1,
        le=10_000_000,
        description=(
            "tidings: events the modules may add to one session before it is aborted as a loop."
        ),
    )


def _tls_matches_scheme(address: str, tls: object | None) -> None:
    """An ``ssl+sbs://`` address needs ``tls``, and ``tls`` needs one."""
    if is_tls(address) and tls is None:
        raise ValueError(f"address {address} is ssl+sbs: tls (cert_file, key_file) must be set")
    if tls is not None and not is_tls(address):
        raise ValueError(f"tls is set: the address must be ssl+sbs://, not {address}")


class EventerServerConfig(ListenerLimitsConfig):
    """``eventer_server``: where clients register, query and subscribe (hat's Eventer)."""

    address: Address = Field(
        default=DEFAULT_EVENTER_ADDRESS,
        description=(
            "The ``tcp+sbs://HOST:PORT`` the Eventer listens on, or ``ssl+sbs://HOST:PORT`` "
            "for TLS (with ``tls``)."
        ),
    )
    tls: TlsServerConfig | None = Field(
        default=None,
        description=(
            "TLS (with an ``ssl+sbs://`` address): the server's certificate and key, and the CA "
            "whose certificates clients must present (mutual TLS)."
        ),
    )
    max_frame_bytes: int = Field(
        default=DEFAULT_MAX_FRAME_BYTES,
        ge=1024,
        le=2**30,
        description=(
            "tidings: the largest frame a client may send; a larger one closes that connection."
        ),
    )
    max_subscriber_lag_bytes: int = Field(
        default=DEFAULT_MAX_SUBSCRIBER_LAG_BYTES,
        ge=1024,
        le=2**32,
        description=(
            "tidings: unsent notify bytes after which a subscriber is disconnected as too slow."
        ),
    )

    anonymous: EventerAnonymousConfig = Field(
        default=EventerAnonymousConfig(),
        description=(
            "tidings: clients without an identity (no verified certificate, no login): where "
            "they may connect from (loopback by default) and what they may do."
        ),
    )
    identities: dict[str, EventerIdentityConfig] = Field(
        default_factory=dict,
        description=(
            "tidings: the identities the Eventer knows, by name (a client certificate's CN, or "
            "a login name), each with what it may do. Listed: a certificate naming another "
            "identity is refused. Empty: every certificate the CA signed may do everything."
        ),
    )

    @model_validator(mode="after")
    def _tls(self) -> EventerServerConfig:
        _tls_matches_scheme(self.address, self.tls)
        for name in self.identities:
            if not name or name != name.strip():
                raise ValueError(f"identities: {name!r} is not an identity name")
        return self


class SyncerServerConfig(ListenerLimitsConfig):
    """``syncer_server``: where redundant peers fetch this server's events."""

    address: Address = Field(
        default=DEFAULT_SYNCER_ADDRESS,
        description=(
            "The ``tcp+sbs://HOST:PORT`` the Syncer listens on, or ``ssl+sbs://HOST:PORT`` for "
            "TLS (with ``tls``)."
        ),
    )
    tls: TlsServerConfig | None = Field(
        default=None,
        description=(
            "TLS (with an ``ssl+sbs://`` address): the server's certificate and key, and the CA "
            "whose certificates peers must present (mutual TLS, on top of ``syncer_token``)."
        ),
    )

    @model_validator(mode="after")
    def _tls(self) -> SyncerServerConfig:
        _tls_matches_scheme(self.address, self.tls)
        return self


class SyncerClientConfig(StrictModel):
    """``syncer_client``: how this server's Syncer connects to its peers' Syncer servers."""

    tls: TlsClientConfig | None = Field(
        default=None,
        description=(
            "For peers at ``ssl+sbs://`` addresses: the CA their certificates are checked "
            "against (absent: the system's CAs) and the certificate presented to peers that "
            "require one."
        ),
    )


class SyncerPeerConfig(StrictModel):
    """A redundant peer server this one keeps in sync with (replaces Monitor discovery)."""

    server_id: int = Field(
        ge=1,
        le=2**63 - 1,
        description="The peer's ``engine.server_id``: the Syncer asks for that server's events.",
    )
    address: Address = Field(
        description="The peer's Syncer address (its ``syncer_server.address``)."
    )
    syncer_token: str | None = Field(
        default=None,
        repr=False,
        description=(
            "The peer's ``syncer_token``; it must equal ours, or the configuration is refused."
        ),
    )


class MonitorConfig(StrictModel):
    """``monitor``: hat-monitor 0.7.2's client configuration (``hat-monitor://client.yaml#``),
    as hat-event 0.8.5 reads it: the Monitor Component's name and group, and the local
    Monitor Server to connect to. Servers of one group sync with each other."""

    name: str = Field(min_length=1, description="This server's Monitor Component name.")
    group: str = Field(min_length=1, description="Its group: servers of one group sync.")
    monitor_address: MonitorAddress = Field(
        description="The local Monitor Server to connect to (``tcp+sbs://``)."
    )


class MetricsEndpointConfig(StrictModel):
    """tidings: serve Prometheus metrics at ``http://<address>:<port>/metrics``."""

    port: int = Field(ge=1, le=65535, description="The port of the /metrics endpoint.")
    address: str = Field(
        default="127.0.0.1",
        min_length=1,
        description=(
            "The interface /metrics listens on; the default keeps metrics on this host, "
            "0.0.0.0 exposes them on every interface."
        ),
    )


class ServerConfig(StrictModel):
    """The whole ``tidings server`` configuration."""

    type: Literal["event"] = Field(
        description="``event``: hat's component type of an event server."
    )
    version: str | None = Field(
        default=None, description="hat-event's version key: accepted, not used."
    )
    log: dict[str, Any] | None = Field(
        default=None,
        description="A ``logging.config.dictConfig`` mapping; absent: tidings' JSON-lines logs.",
    )
    backend: BackendConfig = Field(
        description="Where events are stored: the backend module, its own keys, its durability."
    )
    engine: EngineConfig = Field(
        description="The server's id and the modules that run in each session."
    )
    eventer_server: EventerServerConfig = Field(
        default=EventerServerConfig(),
        description="Where clients register, query and subscribe (hat's Eventer protocol).",
    )
    syncer_server: SyncerServerConfig | None = Field(
        default=None,
        description="Where redundant peers fetch this server's events (absent: no Syncer).",
    )
    syncer_token: str | None = Field(
        default=None,
        repr=False,
        description=(
            "Servers sync only with peers of the same token; through a Monitor, a server without "
            "one syncs with every peer of its group (as in hat-event)."
        ),
    )
    syncer_client: SyncerClientConfig = Field(
        default=SyncerClientConfig(),
        description="tidings: how the Syncer connects to its peers (TLS).",
    )
    syncer_peers: list[SyncerPeerConfig] = Field(
        default_factory=list,
        description=(
            "Redundant peers kept in sync with, where there is no Monitor Server (not with "
            "``monitor``)."
        ),
    )
    monitor: MonitorConfig | None = Field(
        default=None,
        description=(
            "Redundancy through a Hat Monitor Server (absent: standalone, or ``syncer_peers``)."
        ),
    )
    metrics: MetricsEndpointConfig | None = Field(
        default=None, description="tidings: the server's own metrics endpoint (absent: none)."
    )
    retention: LogRetentionConfig | None = Field(
        default=None,
        description=(
            "tidings: what the server's log keeps, by age and count per type pattern, as "
            "hat-event's lmdb limits (absent: everything)."
        ),
    )
    base_dir: Path = Field(
        default_factory=Path.cwd,
        exclude=True,
        description="Directory relative paths are resolved against (the configuration file's).",
    )

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict) and "mariner_server" in data:
            raise ValueError("mariner_server: the Mariner protocol is not supported")
        return data

    @model_validator(mode="after")
    def _peers(self) -> ServerConfig:
        """Refuse a peer the Syncer must not sync with: the one check of the peers, which
        the Syncer client (:mod:`tidings.server.syncer.client`) trusts.

        hat-event's ``syncer_token`` makes servers sync only with peers of the same token
        (both absent counts as equal); ``HatSyncer.MsgReq`` carries no token, so it is
        checked here, against the token configured for the peer. This guards against syncing
        two installations by a configuration mistake; it is not authentication.
        """
        for index, peer in enumerate(self.syncer_peers):
            if peer.server_id == self.engine.server_id:
                raise ValueError(
                    f"syncer_peers.{index}.server_id: {peer.server_id} is this server's own "
                    "engine.server_id; every server of a group needs its own id"
                )
            if peer.syncer_token != self.syncer_token:
                raise ValueError(
                    f"syncer_peers.{index}.syncer_token: "
                    f"{_token_mismatch(peer.syncer_token, self.syncer_token)}; "
                    "servers sync only when their tokens are equal"
                )
        if self.monitor is not None and self.syncer_peers:
            raise ValueError(
                "syncer_peers: not with monitor; with a Monitor Server the peers are the "
                "servers of the monitor group, found as they come and go"
            )
        ids = [peer.server_id for peer in self.syncer_peers]
        if len(ids) != len(set(ids)):
            raise ValueError("syncer_peers: two peers have the same server_id")
        return self

    def resolve(self, path: str | Path) -> Path:
        """``path`` made absolute against the configuration file's directory."""
        return resolve_path(path, self.base_dir)


def _token_mismatch(peer_token: str | None, own_token: str | None) -> str:
    """Why a peer's token does not fit ours, without either token (they are secrets)."""
    if peer_token is None:
        return "not set, but this server has one"
    if own_token is None:
        return "set, but this server has no syncer_token"
    return "does not match this server's syncer_token (neither is shown)"


def require_positive_ints(owner: str, **values: object) -> None:
    """Refuse any of ``values`` that is not a positive int (a bool is not one), naming
    ``owner`` and the argument: the servers check what they are started with from code, which
    no configuration model has checked."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{owner}: {name} must be a positive int, not {value!r}")


def load_server_config(
    data: Any, base_dir: Path | None = None, model: type[ServerConfig] = ServerConfig
) -> ServerConfig:
    """Validate a server configuration mapping as ``model`` (a layer above may extend the
    model with sections of its own, as the streams do)."""
    if isinstance(data, dict) and base_dir is not None:
        data = {**data, "base_dir": base_dir}
    return validate_config(model, data, "server configuration", base_dir)


def default_config_path() -> Path:
    """The first existing ``$XDG_CONFIG_HOME/tidings/event.{yaml,yml,json}``."""
    root = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "tidings"
    for name in DEFAULT_CONFIG_NAMES:
        if (root / name).is_file():
            return root / name
    raise ConfigError(
        f"no server configuration given and none found at {root}/event.yaml (.yml, .json); "
        "pass --conf PATH"
    )


def load_server_config_file(
    path: str | Path | None = None, model: type[ServerConfig] = ServerConfig
) -> ServerConfig:
    """Load and validate a server configuration file (default: :func:`default_config_path`)."""
    path = Path(path) if path is not None else default_config_path()
    return load_server_config(read_config_data(path), path.resolve().parent, model)
