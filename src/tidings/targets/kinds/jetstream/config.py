"""The configuration of a JetStream target: its servers, stream, subjects and security.

Checked when the configuration is read, not at first publish: a subject prefix or template
that NATS would refuse, a credentials, nkey or TLS file that is not there, two identities
at once. What the target needs of its stream follows from it
(:meth:`~JetStreamTargetConfig.stream_needs`).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from tidings.config import (
    DAY,
    HOUR,
    ZERO,
    Duration,
    LocalPath,
    TargetConfig,
    parsed_durations,
    within,
)
from tidings.config.tls import TlsClientConfig, readable_file
from tidings.targets.kinds.jetstream.messages import subject_filter, subject_template
from tidings.targets.kinds.jetstream.stream import CreateStream, StreamNeeds

#: What ``subject_prefix`` may hold, and a subject template once its placeholders are filled.
_SUBJECT = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"


class JetStreamTargetConfig(TargetConfig):
    """A NATS JetStream stream; subjects are ``<subject_prefix>.<event type>`` or come from
    ``subject_template`` (:mod:`tidings.targets.destination`)."""

    kind: Literal["jetstream"] = Field(description="The target's kind: ``jetstream``.")
    servers: list[str] = Field(
        default_factory=lambda: ["nats://127.0.0.1:4222"],
        min_length=1,
        description="The NATS servers' URLs, tried in order.",
    )
    stream: str = Field(
        pattern=r"^[A-Za-z0-9_-]+$", description="The JetStream stream the target publishes to."
    )
    # The template first: the prefix's check reads it (so an error names subject_prefix).
    subject_template: str | None = Field(
        default=None,
        description=(
            "Instead of ``subject_prefix``: a subject with placeholders, e.g. "
            "``orders.{headers.aggregate_type}``; each placeholder's value must be one token."
        ),
    )
    subject_prefix: str | None = Field(
        default=None,
        pattern=_SUBJECT,
        validate_default=True,
        description=(
            "Subjects are ``<subject_prefix>.<type>``, the type made one token (``.``, ``*``, "
            "``>`` and blanks become ``_``); set this or ``subject_template``."
        ),
    )
    duplicate_window: Annotated[Duration, within(ZERO, 365 * DAY)] = Field(
        default=timedelta(minutes=10),
        description=(
            "JetStream's deduplication window (the message id is the event id); an existing "
            "stream's must be at least this long."
        ),
    )
    ack_timeout: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=5),
        description="How long one connection attempt, and the wait for one call's acks, may take.",
    )
    create_stream: CreateStream = Field(
        default="if-missing",
        description=(
            "``if-missing``: create the stream only if it does not exist; ``false``: never; "
            "``true``: create it, or update an existing one that lacks the target's subjects or "
            "has a shorter ``duplicate_window`` (only ``true`` changes an existing stream)."
        ),
    )
    on_mismatch: Literal["warn", "fail"] = Field(
        default="warn",
        description=(
            "An existing stream that lacks the target's subjects or has a shorter "
            "``duplicate_window``: ``warn`` logs a warning; ``fail`` keeps the target unavailable "
            "(events HELD) until the stream fits."
        ),
    )
    # Used only when the target creates the stream.
    storage: Literal["file", "memory"] = Field(
        default="file", description="The storage of a stream the target creates."
    )
    replicas: int = Field(
        default=1, ge=1, le=5, description="The replicas of a stream the target creates."
    )
    max_age: Annotated[Duration, within(ZERO, 36500 * DAY)] | None = Field(
        default=None,
        description="The longest a stream the target creates keeps a message (None: no limit).",
    )
    # Authentication: a user credentials file (JWT + nkey seed) or an nkey seed file.
    credentials: LocalPath | None = Field(
        default=None,
        description="A NATS user credentials file (JWT and seed, as ``nsc`` writes it).",
    )
    nkey: LocalPath | None = Field(
        default=None, description="An nkey seed file (instead of ``credentials``)."
    )
    tls: TlsClientConfig | None = Field(
        default=None,
        description=(
            "TLS to the servers: the CA that signed their certificates (absent: the system's "
            "CAs) and a client certificate for servers that verify clients (``verify: true`` "
            "in nats-server); None: the NATS client's defaults."
        ),
    )

    _durations = parsed_durations("duplicate_window", "ack_timeout")
    _max_age = parsed_durations("max_age", nullable=True)

    @field_validator("credentials", "nkey")
    @classmethod
    def _exists(cls, v: str | None, info: ValidationInfo) -> str | None:
        return readable_file(str(info.field_name), v)

    @field_validator("subject_template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None:
            shape = subject_template(v).literal_shape("X")
            if not re.fullmatch(_SUBJECT, shape):
                raise ValueError(
                    f"{v!r} is not a NATS subject: tokens of letters, digits, _ and - "
                    "separated by '.', placeholders included"
                )
        return v

    @field_validator("subject_prefix")
    @classmethod
    def _one_subject_rule(cls, v: str | None, info: ValidationInfo) -> str | None:
        if "subject_template" not in info.data:
            return v  # the template itself was refused; that error says why
        if (v is None) == (info.data["subject_template"] is None):
            raise ValueError("set exactly one of subject_prefix and subject_template")
        return v

    @model_validator(mode="after")
    def _one_identity(self) -> JetStreamTargetConfig:
        if self.credentials is not None and self.nkey is not None:
            raise ValueError("set credentials or nkey, not both (a credentials file holds one)")
        return self

    def stream_needs(self) -> StreamNeeds:
        """The subjects and settings this target needs of its stream."""
        if self.subject_template is not None:
            publishes = subject_filter(subject_template(self.subject_template))
            creates = publishes
        else:
            publishes, creates = f"{self.subject_prefix}.*", f"{self.subject_prefix}.>"
        return StreamNeeds(
            stream=self.stream,
            publishes=publishes,
            creates=creates,
            duplicate_window=self.duplicate_window,
            storage=self.storage,
            replicas=self.replicas,
            max_age=self.max_age,
        )
