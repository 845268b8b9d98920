"""The replay job (design doc: Event Replay): re-publish PENDING, HELD and FAILED events.

It covers events older than a threshold, skips those past the retry-count threshold (and
keeps the later events of their key held), stops starting new work after a time limit and
takes at most an event-number limit, in log order. It only touches rows the relay has
already handled (``seq`` up to the relay's watermark), so the two never race on an event,
and it holds a database lease, so two replays never run at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from pyspark.sql import SparkSession

from tidings.config import TidingsConfig
from tidings.db import shared_engine
from tidings.outbox.schema import ensure_schema
from tidings.pipeline.jobconfig import job_options
from tidings.pipeline.lease import held
from tidings.pipeline.publishing.outcome import Summary
from tidings.pipeline.source.task import record_batch
from tidings.pipeline.spark import activate

log = logging.getLogger(__name__)
_LEASE_MARGIN_S = 120.0  # the Spark job may run a little past its time limit


@dataclass(frozen=True)
class ReplayLimits:
    older_than: timedelta
    retry_count_threshold: int
    time_limit: timedelta
    event_limit: int

    @classmethod
    def from_config(cls, config: TidingsConfig) -> ReplayLimits:
        r = config.replay
        return cls(r.older_than, r.retry_count_threshold, r.time_limit, r.event_limit)


def run_replay(
    spark: SparkSession,
    config: TidingsConfig,
    config_path: str | None = None,
    limits: ReplayLimits | None = None,
) -> Summary:
    """Run one replay pass and return what it did."""
    limits = limits or ReplayLimits.from_config(config)
    engine = shared_engine(config.database.url)
    ensure_schema(engine)
    with held(engine, "replay", limits.time_limit.total_seconds() + _LEASE_MARGIN_S) as mine:
        if not mine:
            log.warning("another replay holds the replay lease; skipping this run")
            return Summary()
        return _replay(spark, config, config_path, limits)


def _replay(
    spark: SparkSession,
    config: TidingsConfig,
    config_path: str | None,
    limits: ReplayLimits,
) -> Summary:
    options = {
        **job_options(config, config_path),
        "job": "replay",
        "older_than_s": str(limits.older_than.total_seconds()),
        "event_limit": str(limits.event_limit),
        "retry_threshold": str(limits.retry_count_threshold),
        # wall clock: the tasks run in other processes, on other machines on a cluster
        "deadline_epoch": str(time.time() + limits.time_limit.total_seconds()),
    }
    activate(spark)
    frame = spark.read.format("tidings_outbox").options(**options).load()
    rows = frame.collect()  # the tasks publish their slices
    return record_batch(options, "replay", int(time.time() * 1000), rows)
