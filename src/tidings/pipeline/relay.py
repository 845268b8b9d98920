"""The relay: a Spark Structured Streaming query from the event log to the targets."""

from __future__ import annotations

import logging
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from tidings.config import TidingsConfig
from tidings.db import shared_engine
from tidings.outbox.schema import ensure_schema
from tidings.pipeline.jobconfig import job_options

log = logging.getLogger(__name__)


def start_relay(
    spark: SparkSession,
    config: TidingsConfig,
    config_path: str | None = None,
    *,
    available_now: bool = False,
) -> StreamingQuery:
    """Start the relay query; with ``available_now`` it drains what is committed and stops."""
    ensure_schema(shared_engine(config.database.url))
    options = job_options(config, config_path)
    checkpoint = Path(config.relay.checkpoint_dir).absolute()
    checkpoint.mkdir(parents=True, exist_ok=True)
    stream = spark.readStream.format("tidings_outbox").options(**options).load()
    writer = (
        stream.writeStream.format("tidings_publish")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .queryName("tidings-relay")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        ms = int(config.relay.trigger_interval.total_seconds() * 1000)
        writer = writer.trigger(processingTime=f"{ms} milliseconds")
    query = writer.start()
    log.info("relay started", extra={"checkpoint": str(checkpoint), "id": str(query.id)})
    return query
