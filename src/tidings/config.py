"""One validated configuration model for the whole of tidings, loaded from YAML.

Validation errors are turned into :class:`~tidings.errors.ConfigError` messages that name
the offending key path and the value found there, so a typo is found from the message alone.

Relative paths in a configuration *file* (SQLite URLs, the checkpoint and archive
directories, fault files), defaults included, are relative to the file's directory, so a
configuration means the same from any working directory; a mapping validated without a
file keeps them as given (relative to the process's working directory).

Values may come from the environment: ``${VAR}`` and ``${VAR:-default}`` in a file's string
values are replaced when the file is read (:func:`substitute_env`), so secrets need not be
written in it; ``$${`` writes a literal ``${``.

The ``targets:`` section is the one part not spelled out here: each target kind's model is
defined by its module in :mod:`tidings.targets`, which this layer sits below, and entered
into a table this module validates ``targets:`` entries against (:class:`TargetConfig`).
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    SerializeAsAny,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from tidings.address import Address
from tidings.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


#: Built once: building it took a millisecond, paid per duration of every configuration a
#: Spark task decodes.
_TIMEDELTA = TypeAdapter(timedelta)


def parse_duration(value: Any) -> timedelta:
    """Parse ``"30m"``, ``"250ms"``, ``"7d"`` or a number of seconds into a timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return timedelta(seconds=value)
    if isinstance(value, str) and (m := _DURATION.match(value)):
        return timedelta(seconds=float(m.group(1)) * _UNIT_SECONDS[m.group(2)])
    if isinstance(value, str) and value.startswith("P"):  # ISO 8601, as model_dump_json writes
        return _TIMEDELTA.validate_python(value)
    raise ValueError(f"not a duration: {value!r} (use e.g. 250ms, 30s, 30m, 2h, 7d)")


#: In the JSON Schema a duration is what a file may hold: ``"250ms"``, ``"30m"``, an ISO 8601
#: duration (what a dump writes) or a number of seconds.
Duration = Annotated[
    timedelta,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*(ms|s|m|h|d)\s*$|^P"},
                {"type": "number", "minimum": 0},
            ],
            "format": "duration",
        }
    ),
]


def resolve_path(path: str | Path, base_dir: Path) -> Path:
    """``path`` with ``~`` expanded, made absolute against ``base_dir`` if it is relative.

    Configuration files use it so that their relative paths mean the file's directory,
    not whatever directory the process happens to start in.
    """
    path = Path(os.path.expanduser(path))
    return path if path.is_absolute() else base_dir / path


def resolve_location(location: str, base_dir: Path) -> str:
    """A directory or file: a local path is resolved, a URI (``hdfs://``, ``s3a://``,
    ``file:///``) is left to the system that reads it."""
    return location if "://" in location else str(resolve_path(location, base_dir))


def resolve_database_url(url: str, base_dir: Path) -> str:
    """A SQLite URL's file resolved against ``base_dir``; other URLs, in-memory and
    ``file:`` URI databases are left as they are."""
    if not url.startswith("sqlite"):
        return url
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"not a database URL: {url!r} ({exc})") from None
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return url
    resolved = parsed.set(database=str(resolve_path(database, base_dir)))
    return resolved.render_as_string(hide_password=False)


def _relative_to_config_file(resolve: Callable[[str, Path], str]) -> AfterValidator:
    """Resolve the value against the ``base_dir`` of the validation context, if any
    (:func:`load_config_file` gives the file's directory; other loaders give none)."""

    def validate(value: str, info: ValidationInfo) -> str:
        base_dir = (info.context or {}).get("base_dir")
        return value if base_dir is None else resolve(value, base_dir)

    return AfterValidator(validate)


#: A local file or directory (or a URI), relative to the configuration file.
LocalPath = Annotated[str, _relative_to_config_file(resolve_location)]
#: A database URL; a relative SQLite file is relative to the configuration file.
DatabaseUrl = Annotated[str, _relative_to_config_file(resolve_database_url)]
#: Defaults are resolved too: a file that leaves a path out means the same default path
#: beside it, from whichever directory it is loaded.
RESOLVED_DEFAULT: dict[str, Any] = {"validate_default": True}


class StrictModel(BaseModel):
    """The base of every configuration model of tidings: an unknown key is an error (a typo
    must not pass silently) and a validated configuration cannot be changed."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseConfig(StrictModel):
    """Where the service's tables and the event log live."""

    url: DatabaseUrl = Field(default="sqlite:///tidings.db", **RESOLVED_DEFAULT)

    @field_validator("url")
    @classmethod
    def _known_dialect(cls, v: str) -> str:
        if not v.startswith(("sqlite:", "postgresql:", "postgresql+psycopg:")):
            raise ValueError(f"unsupported database url {v!r}: use sqlite:/// or postgresql://")
        return v


class OutboxConfig(StrictModel):
    """Producer-side settings."""

    originator: str = "tidings"
    max_payload_bytes: int = Field(default=1024 * 1024, gt=0)


class TargetConfig(StrictModel):
    """What the configuration of every target kind holds; each kind's model extends it.

    A target module declares its kind and its model (a subclass naming the kind as
    ``kind: Literal["<kind>"]``); the target registry enters the model here with
    :func:`register_target_config`. The models live with their targets, above this layer,
    so ``targets:`` entries are validated against the models entered by the time a
    configuration is validated (see :mod:`tidings.targets.registry` for why).
    """

    kind: str
    fault_file: LocalPath | None = None


#: Target kind -> its configuration model, as the target registry entered them.
_TARGET_CONFIGS: dict[str, type[TargetConfig]] = {}


def register_target_config(model: type[TargetConfig]) -> str:
    """Validate ``targets:`` entries of the kind ``model`` names with ``model``; the kind."""
    kinds = get_args(model.model_fields["kind"].annotation)
    if len(kinds) != 1:
        raise ConfigError(f"{model.__qualname__} must name its kind as kind: Literal['<kind>']")
    (kind,) = kinds
    known = _TARGET_CONFIGS.setdefault(kind, model)
    if known is not model:
        raise ConfigError(
            f"target kind {kind!r} is declared twice: by {known.__module__} and {model.__module__}"
        )
    return kind


@functools.cache
def _kinds_adapter(models: tuple[type[TargetConfig], ...]) -> TypeAdapter[TargetConfig]:
    """The entered models as one union tagged by ``kind``, built once per set of kinds."""
    union = Union[models]  # noqa: UP007 - X | Y cannot spread a tuple built at run time
    return TypeAdapter(Annotated[union, Field(discriminator="kind")])


def _of_its_kind(value: Any, info: ValidationInfo) -> TargetConfig:
    """A ``targets:`` entry validated as the model of its kind (errors name the kind, as
    ``targets.<name>.<kind>.<key>``, and an unknown kind lists the known ones)."""
    if not _TARGET_CONFIGS:
        raise ValueError(
            "no target kinds are loaded: import tidings.targets.registry before validating "
            "a configuration that has targets"
        )
    adapter = _kinds_adapter(tuple(_TARGET_CONFIGS.values()))
    return adapter.validate_python(value, context=info.context)


#: A ``targets:`` entry: validated as its kind's model, dumped with all of that model's keys.
_KindTargetConfig = Annotated[SerializeAsAny[TargetConfig], PlainValidator(_of_its_kind)]


class RoutingConfig(StrictModel):
    """Event type (or ``prefix*`` / ``*`` pattern) -> target names; ``default``: the targets
    of a type no route matches. The database table ``tidings_route`` adds to these."""

    routes: dict[str, list[str]] = Field(default_factory=dict)
    default: list[str] = Field(default_factory=list)
    use_table: bool = True

    @field_validator("routes")
    @classmethod
    def _route_keys(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for key in v:
            if not key.strip() or key != key.strip() or "?" in key or "*" in key[:-1]:
                raise ValueError(
                    f"route key {key!r} must be an event type, a prefix ending in '*' or '*'"
                )
        return v


class RetryConfig(StrictModel):
    """Tries per target before an event is FAILED there, and the pauses between them.

    Exponential by default (200 ms doubling to 30 s, ±20 % jitter: eight tries span about
    25 s, so a network blip of a few seconds costs retries, not a FAILED event); ``backoff``
    gives an explicit schedule instead (one pause per retry, e.g. the patent's
    ``[10ms, 25ms, 40ms]``), and then ``attempts`` is its length plus one.
    """

    attempts: int | None = Field(default=None, ge=1)  # None: 8, or the schedule's length + 1
    initial_backoff: Duration = timedelta(milliseconds=200)
    multiplier: float = Field(default=2.0, ge=1.0)
    max_backoff: Duration = timedelta(seconds=30)
    jitter: float = Field(default=0.2, ge=0.0, le=1.0)
    backoff: list[Duration] | None = None

    _durations = field_validator("initial_backoff", "max_backoff", mode="before")(
        lambda cls, v: parse_duration(v)
    )

    @field_validator("backoff", mode="before")
    @classmethod
    def _schedule(cls, v: Any) -> list[timedelta] | None:
        if v is None:
            return None
        if not isinstance(v, list):
            raise ValueError("backoff must be a list of durations, e.g. [10ms, 25ms, 40ms]")
        return [parse_duration(x) for x in v]

    @property
    def tries(self) -> int:
        """Tries per target: the schedule's length + 1, else ``attempts`` (default 8)."""
        if self.backoff is not None:
            return len(self.backoff) + 1
        return self.attempts or 8

    def model_post_init(self, _context: Any) -> None:
        if self.backoff is not None and self.attempts is not None:
            raise ConfigError(
                "relay.retry: give attempts (exponential backoff) or backoff (an explicit "
                "schedule, attempts = its length + 1), not both"
            )


class RelayConfig(StrictModel):
    """The Spark relay pipeline."""

    spark_master: str = "local[*]"
    checkpoint_dir: LocalPath = Field(default=".tidings/checkpoint", **RESOLVED_DEFAULT)
    trigger_interval: Duration = timedelta(milliseconds=100)
    max_events_per_batch: int = Field(default=100_000, gt=0)
    partitions: int = Field(default=2, gt=0)
    retry: RetryConfig = RetryConfig()
    replay_every: Duration | None = None  # the relay resumes held keys by itself
    shuffle_partitions: int = Field(default=2, gt=0)
    driver_memory: str = Field(default="512m", pattern=r"^\d+[kmgt]$")
    #: The driver JVM's options (``spark.driver.extraJavaOptions``). The default keeps the
    #: JIT at its first tier: the driver runs Spark's per-batch planning, never the events,
    #: and C2 recompiling that code took half its CPU at 1k ev/s (see the design notes).
    driver_java_options: str = "-XX:TieredStopAtLevel=1"

    _durations = field_validator("trigger_interval", "replay_every", mode="before")(
        lambda cls, v: None if v is None else parse_duration(v)
    )

    @field_validator("driver_java_options")
    @classmethod
    def _no_heap_in_java_options(cls, v: str) -> str:
        if any(option.startswith("-Xmx") for option in v.split()):
            raise ValueError("set the driver's heap with relay.driver_memory, not -Xmx here")
        return v

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "retry_backoff" in data:
            raise ValueError(
                "relay.retry_backoff is now relay.retry.backoff (an explicit schedule), "
                "or use relay.retry.attempts with exponential backoff"
            )
        return data


class ReplayConfig(StrictModel):
    """The scheduled replay of PENDING, HELD and FAILED events (design doc: Event Replay)."""

    older_than: Duration = timedelta(seconds=60)
    retry_count_threshold: int = Field(default=20, gt=0)
    time_limit: Duration = timedelta(minutes=5)
    event_limit: int = Field(default=100_000, gt=0)

    _durations = field_validator("older_than", "time_limit", mode="before")(
        lambda cls, v: parse_duration(v)
    )


class HousekeepingConfig(StrictModel):
    """Archiving and deleting published events (design doc: House keeping)."""

    older_than: Duration = timedelta(days=7)
    mode: Literal["archive", "delete"] = "archive"
    archive_dir: LocalPath = Field(default=".tidings/archive", **RESOLVED_DEFAULT)
    delete_on_success: bool = False
    event_limit: int | None = Field(default=None, gt=0)

    _durations = field_validator("older_than", mode="before")(lambda cls, v: parse_duration(v))


class MetricsConfig(StrictModel):
    """Prometheus metrics; ``port`` None means no HTTP endpoint is started."""

    port: int | None = Field(default=None, gt=0, lt=65536)
    #: The interface /metrics listens on; 0.0.0.0 exposes it on every interface.
    address: str = Field(default="127.0.0.1", min_length=1)
    #: Distinct ``event_type`` label values kept; later types are counted as "other".
    max_event_types: int = Field(default=100, gt=0)


_SQL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The kinds a column of an intermediary's table may declare (those of its SQL views).
ColumnKind = Literal["integer", "real", "numeric", "text", "blob"]


def _host_port(value: str) -> str:
    """``HOST:PORT`` (an IPv6 host in brackets), port 0-65535; 0 is any free port."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, e.g. 127.0.0.1:8100, got {value!r}")
    return value


class IntermediaryTableConfig(StrictModel):
    """A domain table an intermediary's SQL views may read, fed by its row-change events
    (``rows.<table>``, :mod:`tidings.intermediary.rows`): its columns (name -> kind, or null
    for a column of unknown kind) and the column its rows are keyed by, or the columns in
    order. (Not ``key``: ``tidings config check`` masks keys so named, as secrets.)"""

    columns: dict[str, ColumnKind | None] = Field(min_length=1)
    keyed_by: str | list[str]

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


class IntermediaryLimitsConfig(StrictModel):
    """Bounds of ``tidings intermediary serve``: per server, per connection, per view."""

    max_connections: int = Field(default=10_000, gt=0)
    #: Event and view messages waiting to be sent on one connection; past this the
    #: subscriber is too slow and is disconnected (close code 4008, with the reason).
    max_queued_messages: int = Field(default=10_000, gt=0)
    max_request_bytes: int = Field(default=64 * 1024, ge=1024)
    requests_per_s: float = Field(default=20.0, gt=0)
    request_burst: int = Field(default=40, gt=0)
    max_subscriptions_per_subscriber: int = Field(default=64, gt=0)
    #: The LIMIT of a view without one, and the highest LIMIT accepted.
    max_view_rows: int = Field(default=10_000, gt=0)
    view_timeout: Duration = timedelta(seconds=5)

    _durations = field_validator("view_timeout", mode="before")(lambda cls, v: parse_duration(v))

    @field_validator("view_timeout")
    @classmethod
    def _positive(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("must be more than zero")
        return v


class IntermediarySpatialConfig(StrictModel):
    """A spatial upstream for ``tidings intermediary serve``: a publisher of moving entities
    speaking the spatial feed protocol (``tidings intermediary simulate``, or your own, see
    :mod:`tidings.intermediary.spatialfeed`), so ``region`` subscriptions are served too."""

    #: Where the publisher listens: ``ws://HOST:PORT/``.
    upstream: str
    #: The world's corners (2 or 3 numbers each): regions are clipped to it upstream.
    world_lo: list[float] = Field(min_length=2, max_length=3)
    world_hi: list[float] = Field(min_length=2, max_length=3)
    #: How far past a region the intermediary asks upstream (claim 2's neighbourhood), so a
    #: moving view stays covered for a while.
    margin: float = Field(default=10.0, ge=0, allow_inf_nan=False)

    @field_validator("upstream")
    @classmethod
    def _ws_url(cls, v: str) -> str:
        if not v.startswith(("ws://", "wss://")):
            raise ValueError(f"expected a ws:// URL of the spatial publisher, got {v!r}")
        return v

    @model_validator(mode="after")
    def _world(self) -> IntermediarySpatialConfig:
        if len(self.world_lo) != len(self.world_hi):
            raise ValueError("world_lo and world_hi must have the same number of axes")
        for axis, (lo, hi) in enumerate(zip(self.world_lo, self.world_hi, strict=True)):
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"world: axis {axis} needs finite world_lo < world_hi")
        return self


class IntermediaryConfig(StrictModel):
    """``tidings intermediary serve``: an intermediary whose upstream is an event server,
    serving event and SQL-view subscriptions over WebSocket (issue 12)."""

    #: ``HOST:PORT`` of its WebSocket endpoint and web page; 0.0.0.0 exposes every interface.
    listen: Annotated[str, AfterValidator(_host_port)] = "127.0.0.1:8100"
    event_server: Address = "tcp+sbs://127.0.0.1:23012"
    #: The type prefix of the event server target the row events reach it through.
    row_type_prefix: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    tables: dict[str, IntermediaryTableConfig] = Field(default_factory=dict)
    #: How often it takes what the event server sent and serves its subscribers.
    tick: Duration = timedelta(milliseconds=20)
    #: How long a request to the event server (a subscription, a table's load) may take.
    request_timeout: Duration = timedelta(seconds=30)
    limits: IntermediaryLimitsConfig = IntermediaryLimitsConfig()
    #: A spatial upstream besides the event server (None: region subscriptions are refused).
    spatial: IntermediarySpatialConfig | None = None

    _durations = field_validator("tick", "request_timeout", mode="before")(
        lambda cls, v: parse_duration(v)
    )

    @field_validator("tick", "request_timeout")
    @classmethod
    def _positive(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("must be more than zero")
        return v

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


class TidingsConfig(StrictModel):
    """The whole configuration."""

    # Sections holding paths are built by validation, so a file's directory reaches their
    # defaults too (a default instance would skip that).
    database: DatabaseConfig = Field(default_factory=dict, **RESOLVED_DEFAULT)
    outbox: OutboxConfig = OutboxConfig()
    targets: dict[str, _KindTargetConfig] = Field(default_factory=dict)
    routing: RoutingConfig = RoutingConfig()
    relay: RelayConfig = Field(default_factory=dict, **RESOLVED_DEFAULT)
    replay: ReplayConfig = ReplayConfig()
    housekeeping: HousekeepingConfig = Field(default_factory=dict, **RESOLVED_DEFAULT)
    metrics: MetricsConfig = MetricsConfig()
    intermediary: IntermediaryConfig = IntermediaryConfig()

    @field_validator("targets")
    @classmethod
    def _target_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise ValueError(f"target name {name!r} may hold only letters, digits, _ . -")
        return v

    def model_post_init(self, _context: Any) -> None:
        retry, threshold = self.relay.retry, self.replay.retry_count_threshold
        attempts = retry.tries
        if attempts - 1 > threshold:
            raise ConfigError(
                f"relay.retry allows {attempts} tries ({attempts - 1} retries), over "
                f"replay.retry_count_threshold ({threshold}), which ends every retry of an "
                "event: raise the threshold or lower the tries"
            )
        named = [(f"routing.routes.{key}", names) for key, names in self.routing.routes.items()]
        for where, names in [*named, ("routing.default", self.routing.default)]:
            for name in names:
                if name not in self.targets:
                    raise ConfigError(
                        f"{where}: unknown target {name!r} "
                        f"(defined targets: {', '.join(sorted(self.targets)) or 'none'})"
                    )


def _describe(error: dict[str, Any]) -> str:
    path = ".".join(str(p) for p in error["loc"]) or "(top level)"
    value = error.get("input")
    if error["type"] == "extra_forbidden":
        return f"{path}: unknown key (value {value!r})"
    if error["type"] == "missing":
        return f"{path}: required key is missing"
    return f"{path}: {error['msg']} (got {value!r})"


M = TypeVar("M", bound=BaseModel)


def validate_config(
    model: type[M], data: Any, what: str = "configuration", base_dir: Path | None = None
) -> M:
    """Validate ``data`` as ``model``; raise ConfigError naming every bad key and value.

    ``base_dir`` (the configuration file's directory) is what relative paths are resolved
    against; without it they stay as given.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must be a mapping at the top level, got {data!r}")
    try:
        return model.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError(
            f"invalid {what}:\n  " + "\n  ".join(_describe(e) for e in exc.errors())
        ) from None


#: ``${NAME}``, ``${NAME:-default}``, or ``$${...}`` (an escaped, literal ``${...}``).
_REFERENCE = re.compile(r"\$(\$?)\{([^}]*)\}")
_VARIABLE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)


def substitute_env(
    data: Any,
    environ: Mapping[str, str] | None = None,
    *,
    origin: str = "configuration",
    used: set[str] | None = None,
) -> Any:
    """``data`` (parsed YAML) with ``${NAME}`` / ``${NAME:-default}`` in its string values
    replaced from ``environ`` (default: the process environment).

    Substitution works on parsed values, never on the file's text, so a secret holding
    quotes, ``#`` or a newline cannot change the document's structure; a value that is
    wholly ``${PORT}`` becomes the string of the variable, which validation then converts
    like any scalar (``"9108"`` to a port number, ``"true"`` to a boolean). As in the shell,
    ``:-`` takes the default when the variable is unset *or empty*. ``$${`` keeps a literal
    ``${``. An unset variable without a default is a ConfigError naming it and the key path
    (a secret must not silently become an empty password). Keys are not substituted.
    ``used`` collects the names of the variables read (to mask their values on display).
    """
    env = os.environ if environ is None else environ

    def value(text: str, path: str) -> str:
        def replace(match: re.Match[str]) -> str:
            escaped, inner = match.groups()
            if escaped:
                return "${" + inner + "}"
            reference = _VARIABLE.fullmatch(inner)
            if reference is None:
                raise ConfigError(
                    f"{origin}: {path}: ${{{inner}}} is not a variable reference "
                    "(use ${NAME} or ${NAME:-default}; $${ keeps a literal ${)"
                )
            name, default = reference.groups()
            if used is not None:
                used.add(name)
            found = env.get(name)
            if found is None or (found == "" and default is not None):
                if default is None:
                    raise ConfigError(
                        f"{origin}: {path}: environment variable {name} is not set "
                        f"(set it, or write ${{{name}:-default}})"
                    )
                return default
            return found

        return _REFERENCE.sub(replace, text)

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, str):
            return value(node, path or "(top level)") if "${" in node else node
        if isinstance(node, dict):
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]
        return node

    return walk(data, "")


def read_config_data(path: str | Path, *, used: set[str] | None = None) -> Any:
    """The parsed content of a YAML (or JSON, a subset of YAML) configuration file, with
    environment variables substituted (:func:`substitute_env`; ``used`` collects their
    names)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {str(path)!r}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return substitute_env(data, origin=str(path), used=used)


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
    if _TARGET_CONFIGS:
        kinds = _kinds_adapter(tuple(_TARGET_CONFIGS.values())).json_schema()
        schema.setdefault("$defs", {}).update(kinds.pop("$defs", {}))
        schema["properties"]["targets"]["additionalProperties"] = kinds
    return schema
