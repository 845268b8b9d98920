"""The relay's Spark Structured Streaming query: built, started, and run a micro-batch at a
time (:class:`BatchRecorder`); and the warm-up query a standby relay runs on the same code
paths while it waits (:func:`warm_up_writer`, :mod:`tidings.pipeline.warmup`).

The query reads the event log (``tidings_outbox``, :mod:`tidings.pipeline.source`); its
tasks publish and its ``foreachBatch`` records each batch. Building it is apart from starting
it, so that a standby relay builds it before it holds the lease (Spark starts a Python
process to create the data source) and only starts it once it does
(:mod:`tidings.pipeline.relay` runs it under the lease).
"""

from __future__ import annotations

import logging
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from tidings.config import TidingsConfig
from tidings.db import shared_engine
from tidings.logs import process_age_s
from tidings.outbox.schema import ensure_schema
from tidings.pipeline.jobconfig import job_options
from tidings.pipeline.source.datasource import WARM_UP_OPTION
from tidings.pipeline.spark import activate, spark_location
from tidings.pipeline.standby import OWNER_OPTION, check_fence

log = logging.getLogger(__name__)
#: The relay query's name (Spark allows one active query of a name per session).
QUERY_NAME = "tidings-relay"


def relay_writer(
    spark: SparkSession,
    config: TidingsConfig,
    config_path: str | None = None,
    *,
    available_now: bool = False,
    lease_owner: str | None = None,
) -> DataStreamWriter:
    """The relay query, built and not started (see :func:`start_relay`)."""
    ensure_schema(shared_engine(config.database.url))
    activate(spark)
    options = job_options(config, config_path)
    if lease_owner is not None:
        options[OWNER_OPTION] = lease_owner
    checkpoint = spark_location(config.relay.checkpoint_dir)  # Spark creates it, also on HDFS
    stream = spark.readStream.format("tidings_outbox").options(**options).load()
    writer = (
        stream.writeStream.foreachBatch(BatchRecorder(options))
        .option("checkpointLocation", checkpoint)
        .queryName(QUERY_NAME)
    )
    if available_now:
        return writer.trigger(availableNow=True)
    ms = int(config.relay.trigger_interval.total_seconds() * 1000)
    return writer.trigger(processingTime=f"{ms} milliseconds")


def start_relay(
    spark: SparkSession,
    config: TidingsConfig,
    config_path: str | None = None,
    *,
    available_now: bool = False,
    lease_owner: str | None = None,
) -> StreamingQuery:
    """Start the relay query; with ``available_now`` it drains what is committed and stops.

    With ``lease_owner`` (the holder of the relay lease) every task and batch checks that
    the lease is still held before it publishes or commits (the fence)."""
    writer = relay_writer(
        spark, config, config_path, available_now=available_now, lease_owner=lease_owner
    )
    return start_writer(writer, config)


def start_writer(writer: DataStreamWriter, config: TidingsConfig) -> StreamingQuery:
    """Start a query :func:`relay_writer` built (now or while standing by)."""
    query = writer.start()
    checkpoint = spark_location(config.relay.checkpoint_dir)
    log.info(
        "relay started",
        extra={"checkpoint": checkpoint, "id": str(query.id), "since_start_s": process_age_s()},
    )
    return query


def warm_up_writer(
    spark: SparkSession,
    config: TidingsConfig,
    config_path: str | None,
    checkpoint: str,
    every_s: float,
) -> DataStreamWriter:
    """A query on the relay's code paths that reads and publishes nothing: the source's
    warm-up mode plans one empty slice per trigger (every ``every_s``), whose task loads what
    a relay task loads and yields an empty summary, recorded by the same
    :class:`BatchRecorder` (nothing to record). It carries no lease owner and has a
    checkpoint of its own (:mod:`tidings.pipeline.warmup`)."""
    activate(spark)
    options = job_options(config, config_path) | {WARM_UP_OPTION: "true"}
    stream = spark.readStream.format("tidings_outbox").options(**options).load()
    return (
        stream.writeStream.foreachBatch(BatchRecorder(options, label="standby warm-up"))
        .option("checkpointLocation", checkpoint)
        .queryName(f"{QUERY_NAME}-warm-up")
        .trigger(processingTime=f"{int(every_s * 1000)} milliseconds")
    )


class BatchRecorder:
    """A micro-batch, run in the driver: its tasks publish their slices (collecting the
    batch runs them), then the batch's summary goes to the batch log.

    Spark writes the batch to its checkpoint's commit log only after this returns, so a
    batch cut short by a crash is run again (same id) and publishes nothing twice. Doing
    the work in the source's tasks and recording it here takes one Python worker per task
    and none per commit, where a Python sink took a second worker per task, a runner for
    its commit and a planning worker per batch.

    The query's first batch is logged when it is planned and when it is recorded (``relay
    first batch planned``, ``... recorded``; ``label`` names the query): with the lease's
    ``relay lease taken`` and ``relay started``, these say how long a relay (a standby taking
    over) took to publish again, and where the time went; a standby's warm-up says when it
    is warm (``standby warm-up first batch recorded``).
    """

    def __init__(self, options: dict[str, str], *, label: str = "relay") -> None:
        self.options = options
        self._label = label
        self._first = True

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        from tidings.pipeline.source.task import record_batch

        if self._first:
            log.info(
                f"{self._label} first batch planned",
                extra={"batch_id": batch_id, "since_start_s": process_age_s()},
            )
        rows = frame.collect()
        check_fence(shared_engine(self.options["database_url"]), self.options)
        summary = record_batch(self.options, "relay", batch_id, rows)
        if self._first:
            self._first = False
            log.info(
                f"{self._label} first batch recorded",
                extra={
                    "batch_id": batch_id,
                    "events": summary.events,
                    "published": summary.published,
                    "since_start_s": process_age_s(),
                },
            )


def wait_between_batches(query: StreamingQuery, timeout: float) -> None:
    """Wait until ``query`` runs no trigger (or ``timeout`` passed): stopping it then
    interrupts no batch between its publishing and its commit."""
    deadline = time.monotonic() + timeout
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)
