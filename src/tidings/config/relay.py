"""The relay's sections of ``tidings.yaml``: the outbox database, the producer, routing, the
relay pipeline and its retries, replay, housekeeping and metrics.

Their defaults are the embedded setup (a SQLite file, Spark in local mode), so an empty file
runs. Paths (the database file, the checkpoint and archive directories) are relative to the
configuration file (:data:`~tidings.config.model.LocalPath`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from tidings.config.metrics import MetricsListenConfig
from tidings.config.model import (
    DAY,
    HOUR,
    SECOND,
    ZERO,
    DatabaseUrl,
    Duration,
    LocalPath,
    ParsedDuration,
    StrictModel,
    parse_duration,
    parsed_durations,
    spoken_duration,
    within,
)
from tidings.errors import ConfigError
from tidings.redaction import shown_url

#: The database URLs tidings runs on (a bare ``mysql://`` or ``mariadb://`` gets PyMySQL).
_KNOWN_URLS = (
    "sqlite:",
    "postgresql:",
    "postgresql+psycopg:",
    "mysql:",
    "mysql+pymysql:",
    "mariadb:",
    "mariadb+pymysql:",
)


class DatabaseConfig(StrictModel):
    """Where the service's tables and the event log live."""

    url: DatabaseUrl = Field(
        default="sqlite:///tidings.db",
        validate_default=True,
        description=(
            "The outbox database: ``sqlite:///FILE`` (relative to this file), "
            "``postgresql://...`` or ``mysql://...`` (MySQL 8 or MariaDB 10.6 and later; "
            "``mariadb://...`` is the same)."
        ),
    )

    @field_validator("url")
    @classmethod
    def _known_dialect(cls, v: str) -> str:
        if not v.startswith(_KNOWN_URLS):
            raise ValueError(
                f"unsupported database url {shown_url(v)}: use sqlite:///, postgresql:// "
                "or mysql://"
            )
        return v


class OutboxConfig(StrictModel):
    """Producer-side settings."""

    originator: str = Field(
        default="tidings",
        description="Stored as each event's originator (its CloudEvents ``source``).",
    )
    max_payload_bytes: int = Field(
        default=1024 * 1024,
        gt=0,
        le=256 * 1024 * 1024,
        description=(
            "The largest payload emit stores, in bytes (after the transformer, as UTF-8); an "
            "outbox built with ``outbox_from_config`` also checks the routed targets' own limits."
        ),
    )


class RoutingConfig(StrictModel):
    """Event type (or ``prefix*`` / ``*`` pattern) -> target names; ``default``: the targets
    of a type no route matches. The database table ``tidings_route`` adds to these."""

    routes: dict[str, list[str]] = Field(
        default_factory=dict,
        description=(
            "Event type, ``prefix*`` or ``*`` -> the names of the targets it goes to; an event "
            "goes to the targets of every key that matches it."
        ),
    )
    default: list[str] = Field(
        default_factory=list,
        description="The targets of an event type no route matches (without any: UNROUTABLE).",
    )
    use_table: bool = Field(
        default=True, description="Add the routes of the database table ``tidings_route`` to these."
    )

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

    attempts: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="Tries per target (None: 8, or the schedule's length + 1).",
    )
    initial_backoff: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(milliseconds=200), description="The pause before the first retry."
    )
    multiplier: float = Field(
        default=2.0, ge=1.0, le=100.0, description="Each pause is the previous one times this."
    )
    max_backoff: Annotated[Duration, within(ZERO, DAY)] = Field(
        default=timedelta(seconds=30), description="No pause is longer than this."
    )
    jitter: float = Field(
        default=0.2, ge=0.0, le=1.0, description="A pause varies by up to this fraction either way."
    )
    backoff: list[Annotated[Duration, within(ZERO, HOUR, zero=True)]] | None = Field(
        default=None,
        description="An explicit schedule, one pause per retry (instead of ``attempts``).",
    )

    _durations = parsed_durations("initial_backoff", "max_backoff")

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


class RelayLeaseConfig(StrictModel):
    """The relay's lease: one relay publishes, any other started on the same outbox stands by.

    A standby takes over at most ``ttl`` (plus one ``poll_every`` and its query's start) after
    the active relay last renewed. The active relay stops publishing once ``ttl`` minus one
    ``renew_every`` has passed since it last sent a renewal that succeeded, before the lease
    can expire under it; ``ttl`` must therefore leave room for at least three renewals."""

    ttl: Annotated[ParsedDuration, within(SECOND, 10 * 60 * SECOND)] = Field(
        default=timedelta(seconds=5),
        description=(
            "How long the lease lasts after each renewal (database clock): the longest a "
            "dead relay's standby waits before taking over."
        ),
    )
    renew_every: Annotated[ParsedDuration, within(ZERO, 60 * SECOND)] = Field(
        default=timedelta(seconds=1),
        description="How often the active relay renews its lease.",
    )
    poll_every: Annotated[ParsedDuration, within(ZERO, 60 * SECOND)] = Field(
        default=timedelta(milliseconds=500),
        description="How often a standby relay tries to take the lease.",
    )

    @model_validator(mode="after")
    def _room_to_renew(self) -> RelayLeaseConfig:
        if self.renew_every * 3 > self.ttl:
            raise ValueError(
                f"relay.lease.renew_every ({spoken_duration(self.renew_every)}) must be at most a "
                f"third of relay.lease.ttl ({spoken_duration(self.ttl)}): the active relay needs "
                "room for retries before its lease could expire"
            )
        if self.poll_every > self.ttl:
            raise ValueError(
                f"relay.lease.poll_every ({spoken_duration(self.poll_every)}) must be at most "
                f"relay.lease.ttl ({spoken_duration(self.ttl)})"
            )
        return self


class RelayConfig(StrictModel):
    """The Spark relay pipeline."""

    spark_master: str = Field(
        default="local[*]",
        description="Spark's master URL: ``local[*]`` in this process, or a cluster's.",
    )
    checkpoint_dir: LocalPath = Field(
        default=".tidings/checkpoint",
        validate_default=True,
        description=(
            "The streaming query's checkpoint (a directory or a ``hdfs://``, ``s3a://`` URI)."
        ),
    )
    trigger_interval: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(milliseconds=100), description="How often a micro-batch starts."
    )
    max_events_per_batch: int = Field(
        default=100_000, gt=0, le=10_000_000, description="The most events one micro-batch reads."
    )
    partitions: int = Field(
        default=2,
        gt=0,
        le=4096,
        description=(
            "Spark tasks per batch (events are split by a hash of their partition key); a batch "
            "of under 5,000 events per task uses fewer."
        ),
    )
    retry: RetryConfig = Field(
        default=RetryConfig(),
        description="Tries per target before an event is FAILED there, and the pauses between.",
    )
    lease: RelayLeaseConfig = Field(
        default=RelayLeaseConfig(),
        description="The lease that keeps a second relay on the same outbox standing by.",
    )
    replay_every: Annotated[Duration, within(ZERO, 7 * DAY)] | None = Field(
        default=None,
        description=(
            "How often the replay job runs in the relay's Spark session, trying FAILED events "
            "again (None: never; the relay resumes held events and sends due retries by itself)."
        ),
    )
    shuffle_partitions: int = Field(
        default=2,
        gt=0,
        le=100_000,
        description=(
            "Spark's shuffle partitions (``spark.sql.shuffle.partitions``); only housekeeping's "
            "archive write, by day and type, shuffles."
        ),
    )
    driver_memory: str = Field(
        default="512m",
        pattern=r"^\d+[kmgt]$",
        description="The driver JVM's heap (``spark.driver.memory``).",
    )
    driver_java_options: str = Field(
        default="-XX:TieredStopAtLevel=1",
        description=(
            "The driver JVM's options (``spark.driver.extraJavaOptions``). The default keeps the "
            "JIT at its first tier: the driver runs Spark's per-batch planning, never the events, "
            "and C2 recompiling that code took half its CPU at 1k ev/s (see the design notes)."
        ),
    )

    jvm_class_archive: LocalPath | None = Field(
        default=None,
        description=(
            "A class data sharing archive of Spark's driver classes, made by ``tidings relay "
            "--make-class-archive``: the driver JVM maps the classes it loads at start from it "
            "instead of loading them one by one (a faster start). Used only if the file "
            "exists; made again after an upgrade of Spark or Java."
        ),
    )

    _durations = parsed_durations("trigger_interval", "replay_every", nullable=True)

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

    older_than: Annotated[Duration, within(ZERO, 3650 * DAY, zero=True)] = Field(
        default=timedelta(seconds=60),
        description="Only open events logged longer ago than this are replayed.",
    )
    retry_count_threshold: int = Field(
        default=20,
        gt=0,
        le=1_000_000,
        description=(
            "An event retried this often is no longer retried, by the relay or a replay: it "
            "stays FAILED and its key's later events wait for it at that target."
        ),
    )
    time_limit: Annotated[Duration, within(ZERO, DAY)] = Field(
        default=timedelta(minutes=5),
        description="How long one replay run may go on sending; it stops at this deadline.",
    )
    event_limit: int = Field(
        default=100_000, gt=0, le=1_000_000_000, description="The most events one replay run takes."
    )

    _durations = parsed_durations("older_than", "time_limit")


class HousekeepingConfig(StrictModel):
    """Archiving and deleting published events (design doc: House keeping)."""

    older_than: Annotated[Duration, within(ZERO, 3650 * DAY, zero=True)] = Field(
        default=timedelta(days=7),
        description=(
            "Only events PUBLISHED longer ago than this, and logged before today, are archived "
            "or deleted."
        ),
    )
    mode: Literal["archive", "delete"] = Field(
        default="archive",
        description="Archive published events before deleting them, or only delete them.",
    )
    archive_dir: LocalPath = Field(
        default=".tidings/archive",
        validate_default=True,
        description="Where archived events are written as Parquet (a directory or a URI).",
    )
    delete_on_success: bool = Field(
        default=False,
        description=(
            "The design document's completion mode: the relay deletes an event's row once every "
            "target confirmed it, instead of leaving it for housekeeping."
        ),
    )
    event_limit: int | None = Field(
        default=None,
        gt=0,
        le=10_000_000_000,
        description="The most events one run archives or deletes (None: all).",
    )

    _durations = parsed_durations("older_than")


class MetricsConfig(MetricsListenConfig):
    """Prometheus metrics; ``port`` None means no HTTP endpoint is started (the endpoint's
    keys are :class:`~tidings.config.metrics.MetricsListenConfig`'s, shared with the
    intermediaries)."""

    max_event_types: int = Field(
        default=100,
        gt=0,
        le=100_000,
        description=(
            'Distinct ``event_type`` label values kept; later types are counted as "other".'
        ),
    )
