"""The configuration of tidings: validated pydantic models of the files it reads.

Two files, for now: ``tidings.yaml`` (the relay, its targets and the intermediaries) and the
event server's file (hat-event's server.yaml, plus the streams the server serves). Each is
one model, built from one module per part, on shared machinery:

- :mod:`.model`: the strict base model, durations, paths relative to the file;
- :mod:`.loading`: reading a file, ``${VAR}`` from the environment, error messages that name
  the key;
- :mod:`.targets`, :mod:`.relay`, :mod:`.intermediary`: the sections of ``tidings.yaml``,
  and :mod:`.tidings_file`: the file as a whole (loading it, finding it, its JSON Schema);
- :mod:`.tls`: the TLS settings of every link, server side and client side;
- :mod:`.server`: the event server's file, with who may use its Eventer
  (:mod:`.eventer_access`);
- :mod:`.passwords`, :mod:`.stream_types`, :mod:`.stream_access`, :mod:`.streams`: the
  streams' sections of the event server's file (the password hashes they hold, the type maps
  they check, what each user may do) and the files of the streams' Spark jobs.

This package sits low (above the event model and addresses, below the database and every
part), so a part's runtime objects stay with the part and are built from these models. Here
are the names of ``tidings.yaml`` and the machinery; the event server's and the streams'
models are imported from :mod:`.server` and :mod:`.streams`.
"""

from tidings.config.intermediary import (
    ColumnKind,
    IntermediaryConfig,
    IntermediaryLimitsConfig,
    IntermediarySpatialConfig,
    IntermediaryTableConfig,
)
from tidings.config.intermediary_tier import IntermediaryTierConfig, TierResponsibilityConfig
from tidings.config.loading import read_config_data, substitute_env, validate_config
from tidings.config.model import (
    DAY,
    HOUR,
    MS,
    RESOLVED_DEFAULT,
    SECOND,
    ZERO,
    DatabaseUrl,
    Duration,
    LocalPath,
    StrictModel,
    parse_duration,
    parsed_durations,
    resolve_database_url,
    resolve_location,
    resolve_path,
    within,
)
from tidings.config.relay import (
    DatabaseConfig,
    HousekeepingConfig,
    MetricsConfig,
    OutboxConfig,
    RelayConfig,
    ReplayConfig,
    RetryConfig,
    RoutingConfig,
)
from tidings.config.targets import TargetConfig, register_target_config
from tidings.config.tidings_file import (
    CONFIG_ENV,
    DEFAULT_CONFIG_FILE,
    TidingsConfig,
    config_json_schema,
    find_config_file,
    load_config,
    load_config_file,
)

__all__ = [
    "CONFIG_ENV",
    "DAY",
    "DEFAULT_CONFIG_FILE",
    "HOUR",
    "MS",
    "RESOLVED_DEFAULT",
    "SECOND",
    "ZERO",
    "ColumnKind",
    "DatabaseConfig",
    "DatabaseUrl",
    "Duration",
    "HousekeepingConfig",
    "IntermediaryConfig",
    "IntermediaryLimitsConfig",
    "IntermediarySpatialConfig",
    "IntermediaryTableConfig",
    "IntermediaryTierConfig",
    "LocalPath",
    "MetricsConfig",
    "OutboxConfig",
    "RelayConfig",
    "ReplayConfig",
    "RetryConfig",
    "RoutingConfig",
    "StrictModel",
    "TargetConfig",
    "TidingsConfig",
    "TierResponsibilityConfig",
    "config_json_schema",
    "find_config_file",
    "load_config",
    "load_config_file",
    "parse_duration",
    "parsed_durations",
    "read_config_data",
    "register_target_config",
    "resolve_database_url",
    "resolve_location",
    "resolve_path",
    "substitute_env",
    "validate_config",
    "within",
]
