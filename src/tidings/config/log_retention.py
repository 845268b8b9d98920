"""``retention`` of the event server's file: how long the server's own log keeps events
(see :mod:`tidings.server.log_retention`).

Shaped like hat-event's lmdb backend: each rule is an ``ordered`` entry's ``subscriptions``
with its ``limit`` (``duration`` in seconds or as a duration, ``max_entries``,
``min_entries``), so a hat configuration's limits move over key for key. An event belongs to
the first rule whose subscriptions match its type; an event no rule matches is kept.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from tidings.config.model import (
    DAY,
    HOUR,
    MS,
    ZERO,
    ParsedDuration,
    StrictModel,
    within,
)
from tidings.errors import StoreError
from tidings.events.matching import QueryType, validate_query_type


def _patterns(value: list[tuple[str, ...]]) -> list[QueryType]:
    """Hat type patterns, each checked (``*`` only last), as a ValueError for pydantic."""
    try:
        return [validate_query_type(tuple(t)) for t in value]
    except StoreError as exc:
        raise ValueError(str(exc)) from None


def _query_types(value: list[tuple[str, ...]]) -> list[QueryType]:
    types = _patterns(value)
    if not types:
        raise ValueError("must list at least one event type pattern")
    return types


class RetentionRuleConfig(StrictModel):
    """One rule: the types it covers and its limits (hat-event's ``ordered[].limit``)."""

    subscriptions: list[tuple[str, ...]] = Field(
        description="The type patterns of the rule (``?`` one segment, ``*`` the rest)."
    )
    duration: Annotated[ParsedDuration, within(ZERO, 36500 * DAY)] | None = Field(
        default=None,
        description="Delete events older than this (hat: ``limit.duration``, in seconds).",
    )
    max_entries: int | None = Field(
        default=None,
        ge=0,
        description="Delete the oldest of the rule's events beyond this many "
        "(hat: ``limit.max_entries``).",
    )
    min_entries: int = Field(
        default=0,
        ge=0,
        description="Never delete the newest this many of the rule's events "
        "(hat: ``limit.min_entries``).",
    )

    _types = field_validator("subscriptions")(lambda cls, v: _query_types(v))

    @model_validator(mode="after")
    def _some_limit(self) -> RetentionRuleConfig:
        if self.duration is None and self.max_entries is None:
            raise ValueError("give duration, max_entries or both (a rule without either keeps all)")
        return self


class LogRetentionConfig(StrictModel):
    """``retention``: the rules, what they never delete, and how the passes run."""

    rules: list[RetentionRuleConfig] = Field(
        min_length=1, description="The rules, in order: an event follows the first it matches."
    )
    tables: list[tuple[str, ...]] = Field(
        default_factory=list,
        description=(
            "Types intermediaries load as tables (latest event per key): the newest event of "
            "every key of these types stays, besides those the server has been asked to load "
            "since it started."
        ),
    )
    peer_horizon: Annotated[ParsedDuration, within(ZERO, 3650 * DAY, zero=True)] = Field(
        default=timedelta(days=1),
        description=(
            "A Syncer peer that left holds the events it was not sent yet this long; after "
            "that it is beyond the horizon and holds nothing."
        ),
    )
    min_age: Annotated[ParsedDuration, within(ZERO, 3650 * DAY, zero=True)] = Field(
        default=timedelta(hours=1),
        description=(
            "Events younger than this stay whatever the rules say, so that a re-published "
            "outbox event is still recognised by its stored copy. A ``tidings.yaml`` refuses "
            "one shorter than the ``failover_resend`` of an ``event_server`` target "
            "publishing into the server."
        ),
    )
    every: Annotated[ParsedDuration, within(10 * MS, HOUR)] = Field(
        default=timedelta(seconds=60), description="How often a retention pass runs."
    )
    batch: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Events deleted per transaction (the append lock is held for one).",
    )

    _tables = field_validator("tables")(lambda cls, v: [validate_query_type(tuple(t)) for t in v])
