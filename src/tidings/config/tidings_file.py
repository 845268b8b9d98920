"""``tidings.yaml``: one file that can describe a whole deployment, as one validated model.

It holds the relay's sections (:mod:`.relay`), the targets (:mod:`.targets`), the event servers
with their streams (``servers:``, each entry an event server's file, :mod:`.streams`), the
intermediaries (``intermediaries:``, and the older single ``intermediary:`` section,
:mod:`.intermediary`; tiers of them, ``intermediary_tiers:``, :mod:`.intermediary_tier`), the
operator's console (``console:``, :mod:`.console`), and
checks what crosses them inside the file (routes name defined targets; retries stay under the
replay's threshold). The checks across parts (ports, addresses, type prefixes, feeds) are the
system check's (:mod:`tidings.system.checks`). The hat-format server file stays a file of its
own too, for hat users (:mod:`.server`).

Relative paths in a configuration *file* (SQLite URLs, the checkpoint and archive
directories, fault files), defaults included, are relative to the file's directory, so a
configuration means the same from any working directory; a mapping validated without a
file keeps them as given (relative to the process's working directory). Values may come from
the environment (``${VAR}``, see :mod:`.loading`).
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

import tidings.config.relay as sections
from tidings.address import parse_address
from tidings.config.console import ConsoleConfig
from tidings.config.intermediary import IntermediaryConfig
from tidings.config.intermediary_tier import IntermediaryTierConfig
from tidings.config.loading import read_config_data, validate_config
from tidings.config.model import StrictModel, spoken_duration
from tidings.config.streams import StreamServerConfig
from tidings.config.targets import KindTargetConfig, target_kinds_json_schema
from tidings.errors import ConfigError


class TidingsConfig(StrictModel):
    """The whole of ``tidings.yaml``."""

    # Sections holding paths are built by validation, so a file's directory reaches their
    # defaults too (a default instance would skip that).
    database: sections.DatabaseConfig = Field(
        default_factory=dict, validate_default=True, description="The outbox database."
    )
    outbox: sections.OutboxConfig = Field(
        default=sections.OutboxConfig(), description="The producer's settings."
    )
    targets: dict[str, KindTargetConfig] = Field(
        default_factory=dict,
        description="Where events go, by name: each entry's ``kind`` names its model.",
    )
    routing: sections.RoutingConfig = Field(
        default=sections.RoutingConfig(), description="Which targets each event type goes to."
    )
    relay: sections.RelayConfig = Field(
        default_factory=dict, validate_default=True, description="The Spark relay pipeline."
    )
    replay: sections.ReplayConfig = Field(
        default=sections.ReplayConfig(),
        description="The scheduled replay of PENDING, HELD and FAILED events.",
    )
    housekeeping: sections.HousekeepingConfig = Field(
        default_factory=dict,
        validate_default=True,
        description="Archiving and deleting published events.",
    )
    metrics: sections.MetricsConfig = Field(
        default=sections.MetricsConfig(), description="The relay's Prometheus metrics."
    )
    intermediary: IntermediaryConfig = Field(
        default=IntermediaryConfig(),
        description=(
            "One intermediary, the older way (``tidings intermediary serve`` without ``--name``); "
            "``intermediaries:`` names several."
        ),
    )
    servers: dict[str, StreamServerConfig] = Field(
        default_factory=dict,
        description=(
            "The deployment's event servers, by name: each entry holds what an event server's own "
            "file holds (hat-event's server.yaml keys plus ``stream_users`` and ``streams``); "
            "``type: event`` may be left out. Relative paths are relative to this file."
        ),
    )
    intermediaries: dict[str, IntermediaryConfig] = Field(
        default_factory=dict,
        description="The deployment's intermediaries by name, each like ``intermediary:``.",
    )
    intermediary_tiers: dict[str, IntermediaryTierConfig] = Field(
        default_factory=dict,
        description=(
            "Tiers of intermediaries by name (``tidings intermediary serve --tier NAME``): "
            "several members sharing one spatial publisher, responsibility split among them."
        ),
    )

    console: ConsoleConfig | None = Field(
        default=None,
        description=(
            "The operator's web console (``tidings console``; ``tidings run`` runs it too): "
            "where it listens, who may log in and with which role."
        ),
    )

    @field_validator("targets", "servers", "intermediaries", "intermediary_tiers")
    @classmethod
    def _part_names(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        what = {
            "targets": "target",
            "servers": "server",
            "intermediaries": "intermediary",
            "intermediary_tiers": "tier",
        }
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise ValueError(
                    f"{what[str(info.field_name)]} name {name!r} may hold only letters, "
                    "digits, _ . -"
                )
        return v

    @field_validator("servers", mode="before")
    @classmethod
    def _server_files(cls, v: Any, info: ValidationInfo) -> Any:
        """Give each server entry what its own file would have: hat's ``type: event`` and the
        directory its relative paths are resolved against (this file's)."""
        if not isinstance(v, dict):
            return v
        base_dir = (info.context or {}).get("base_dir") or Path.cwd()
        return {
            name: {"type": "event", **entry, "base_dir": str(base_dir)}
            if isinstance(entry, dict)
            else entry
            for name, entry in v.items()
        }

    @field_validator("servers")
    @classmethod
    def _servers_resolved(cls, v: dict[str, StreamServerConfig]) -> dict[str, StreamServerConfig]:
        """Each server's TLS paths made absolute, as its own file's loader does."""
        return {name: server.resolved() for name, server in v.items()}

    def model_post_init(self, _context: Any) -> None:
        retry, threshold = self.relay.retry, self.replay.retry_count_threshold
        attempts = retry.tries
        if attempts - 1 > threshold:
            raise ConfigError(
                f"relay.retry allows {attempts} tries ({attempts - 1} retries), over "
                f"replay.retry_count_threshold ({threshold}), which ends every retry of an "
                "event: raise the threshold or lower the tries"
            )
        _check_resend_windows(self)
        named = [(f"routing.routes.{key}", names) for key, names in self.routing.routes.items()]
        for where, names in [*named, ("routing.default", self.routing.default)]:
            for name in names:
                if name not in self.targets:
                    raise ConfigError(
                        f"{where}: unknown target {name!r} "
                        f"(defined targets: {', '.join(sorted(self.targets)) or 'none'})"
                    )


def _check_resend_windows(config: TidingsConfig) -> None:
    """Refuse a retention ``min_age`` (a stream's, or the server log's) shorter than the
    ``failover_resend`` window of an ``event_server`` target publishing into its server.

    After a failover the target sends the events its lost server confirmed within that
    window again, to the next server, which recognises each by its stored copy. Retention
    may discard an event that every consumer has read once it is ``min_age`` old; if that
    can happen inside the window, the event sent again finds no copy, is stored a second
    time, and every consumer gets it twice: the exactly-once promise of the event server
    target broken by configuration. So this is an error, not a warning.
    """
    for target_name, target in config.targets.items():
        window: timedelta = getattr(target, "failover_resend", timedelta(0))
        if target.kind != "event_server" or window <= timedelta(0):
            continue
        for server_name, server in _servers_fed(config, target).items():
            ages = [
                (f"servers.{server_name}.streams[{index}].retention.min_age", s.retention.min_age)
                for index, s in enumerate(server.streams)
                if s.retention.enabled
            ]
            if server.retention is not None:  # the server's own log (its rules)
                ages.append((f"servers.{server_name}.retention.min_age", server.retention.min_age))
            for where, min_age in ages:
                if min_age < window:
                    raise ConfigError(
                        f"{where} ({spoken_duration(min_age)}) is shorter than "
                        f"targets.{target_name}.failover_resend ({spoken_duration(window)}): "
                        "after a failover the target sends the events of that window again, "
                        "and one that retention had discarded would be stored and delivered "
                        "twice; raise min_age to at least the window or shorten the window"
                    )


def _servers_fed(config: TidingsConfig, target: KindTargetConfig) -> dict[str, StreamServerConfig]:
    """The configured servers an ``event_server`` target publishes to: those its addresses
    name (by host and port), or those of its Monitor group."""
    monitor = getattr(target, "monitor", None)
    if monitor is not None:
        return {
            name: server
            for name, server in config.servers.items()
            if server.monitor is not None and server.monitor.group == monitor.server_group
        }
    wanted = {parse_address(str(a)) for a in getattr(target, "server_addresses", [])}
    return {
        name: server
        for name, server in config.servers.items()
        if parse_address(server.eventer_server.address) in wanted
    }


def load_config(data: dict[str, Any] | None = None) -> TidingsConfig:
    """Validate a configuration mapping; raise ConfigError naming every bad key and value."""
    return validate_config(TidingsConfig, data)


def load_config_file(path: str | Path, *, used: set[str] | None = None) -> TidingsConfig:
    """Load and validate a YAML configuration file; its relative paths are relative to it,
    and ``${VAR}`` in its values come from the environment (``used`` collects their names)."""
    path = Path(path)
    return validate_config(
        TidingsConfig, read_config_data(path, used=used), base_dir=path.resolve().parent
    )


#: The environment variable naming the configuration file when no ``-c`` is given.
CONFIG_ENV = "TIDINGS_CONFIG"
#: The file looked for in the working directory when neither ``-c`` nor CONFIG_ENV names one.
DEFAULT_CONFIG_FILE = "tidings.yaml"


def find_config_file(path: str | Path | None = None) -> Path | None:
    """The configuration file to use: ``path`` if given, else ``$TIDINGS_CONFIG`` if set,
    else ``./tidings.yaml`` if it exists, else None (the defaults).

    A file that is named (by ``path`` or the variable) is returned whether or not it
    exists, so that reading it fails with its name rather than falling back to defaults.
    """
    if path:
        return Path(path)
    if named := os.environ.get(CONFIG_ENV):
        return Path(named)
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.is_file() else None


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema of :class:`TidingsConfig` (what a file holds after substitution),
    ``targets:`` entries being the union of the target kinds entered by then (import
    :mod:`tidings.targets.registry` first)."""
    schema = TidingsConfig.model_json_schema()
    kinds = target_kinds_json_schema()
    if kinds is not None:
        schema.setdefault("$defs", {}).update(kinds.pop("$defs", {}))
        schema["properties"]["targets"]["additionalProperties"] = kinds
    return schema
