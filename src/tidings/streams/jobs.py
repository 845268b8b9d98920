"""Spark jobs over FTN18 streams: the archiver, and the aggregation of partitioned streams.

Both read with the ``tidings_stream`` source (:mod:`.spark_source`), so each is a registered
reliable consumer of its streams, acknowledged only when Spark commits a micro-batch.

- **Archive** (FTN18 2.3.1): the stream's events as Parquet, in the layout of the outbox
  housekeeping archive (:mod:`tidings.pipeline.archive_layout`: partitioned by ``day`` and
  ``type``), through Spark's file sink, which commits
  each micro-batch's files exactly once with the checkpoint. Since the archiver is a
  registered consumer, retention never discards an event it has not archived.
- **Aggregate** (FTN18 2.3.3): several streams (say, one per partition or server) into one
  event store, where the events get new ids (the store's positions). Each source's events
  are stored in their id order, and each is stored once across restarts: its outbox event id
  is derived from ``(source, id)``, by which the store recognises a batch that Spark runs
  again after a crash.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from tidings.errors import StreamError
from tidings.events.model import NewEvent, PayloadKind
from tidings.pipeline.archive_layout import DAY, STREAM_PARTITIONS, day_column
from tidings.pipeline.spark import spark_location
from tidings.server.store import EventStore
from tidings.streams.spark_source import TidingsStreamDataSource

#: Namespace of the outbox event ids the aggregation derives from (source, id).
_AGGREGATE_NAMESPACE = uuid.UUID("5f1b1d6e-41d2-4f49-9a43-2f0c7d9a8e11")


def register_stream_source(spark: SparkSession) -> None:
    """Make ``format("tidings_stream")`` known to ``spark``."""
    spark.dataSource.register(TidingsStreamDataSource)


def read_stream(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """A streaming DataFrame of one FTN18 stream (see :mod:`.spark_source` for options)."""
    register_stream_source(spark)
    return spark.readStream.format("tidings_stream").options(**dict(options)).load()


def start_archive(
    spark: SparkSession,
    options: Mapping[str, str],
    archive_dir: str,
    checkpoint_dir: str,
    *,
    once: bool = False,
    every: timedelta = timedelta(seconds=10),
) -> StreamingQuery:
    """Start archiving a stream into ``archive_dir``; the running query."""
    frame = read_stream(spark, options).withColumn(DAY, day_column("ts"))
    writer = (
        frame.writeStream.format("parquet")
        .partitionBy(*STREAM_PARTITIONS)
        .option("path", spark_location(archive_dir))
        .option("checkpointLocation", spark_location(checkpoint_dir))
        .queryName("tidings-stream-archive")
    )
    trigger: dict[str, Any] = (
        {"availableNow": True} if once else {"processingTime": f"{every.total_seconds()} seconds"}
    )
    return writer.trigger(**trigger).start()


@dataclass(frozen=True)
class AggregatedEvent:
    """One source event as the aggregation stores it."""

    source: str
    id: int
    type: str
    data: str
    ts_us: int

    @property
    def outbox_event_id(self) -> str:
        return str(uuid.uuid5(_AGGREGATE_NAMESPACE, f"{self.source}:{self.id}"))


def ordered(rows: Sequence[Any]) -> list[AggregatedEvent]:
    """A micro-batch's rows as events, each source's in id order (sources interleave by
    timestamp, so the aggregate follows the order things happened across them)."""
    events = [
        AggregatedEvent(row["source"], int(row["id"]), row["type"], row["data"], _micros(row["ts"]))
        for row in rows
    ]
    by_source: dict[str, list[AggregatedEvent]] = {}
    for event in sorted(events, key=lambda e: (e.source, e.id)):
        by_source.setdefault(event.source, []).append(event)
    merged: list[AggregatedEvent] = []
    heads = {source: 0 for source in by_source}
    while heads:
        source = min(heads, key=lambda s: (by_source[s][heads[s]].ts_us, s))
        merged.append(by_source[source][heads[source]])
        heads[source] += 1
        if heads[source] == len(by_source[source]):
            del heads[source]
    return merged


def union_sources(spark: SparkSession, sources: Mapping[str, Mapping[str, str]]) -> DataFrame:
    """The streams of ``sources`` (name -> source options) as one frame with a ``source``
    column."""
    if not sources:
        raise StreamError("InvalidRequest", "aggregation needs at least one source")
    frames = [
        read_stream(spark, options).withColumn("source", F.lit(name))
        for name, options in sources.items()
    ]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def start_aggregate(
    spark: SparkSession,
    sources: Mapping[str, Mapping[str, str]],
    store_url: str,
    type_prefix: Sequence[str],
    checkpoint_dir: str,
    *,
    server_id: int = 1,
    once: bool = False,
    every: timedelta = timedelta(seconds=1),
) -> StreamingQuery:
    """Start aggregating ``sources`` into the event store at ``store_url``: an event of
    source ``s`` and FTN18 type ``T`` is stored as type ``(*type_prefix, s, T)`` with its
    data as the JSON payload and its ``ts`` as the source timestamp."""
    prefix = tuple(type_prefix)

    def store_batch(frame: DataFrame, _batch_id: int) -> None:
        events = ordered(frame.collect())
        if events:
            store = _store(store_url, server_id)
            store.register([_new_event(event, prefix) for event in events])

    trigger: dict[str, Any] = (
        {"availableNow": True} if once else {"processingTime": f"{every.total_seconds()} seconds"}
    )
    return (
        union_sources(spark, sources)
        .writeStream.foreachBatch(store_batch)
        .option("checkpointLocation", spark_location(checkpoint_dir))
        .queryName("tidings-stream-aggregate")
        .trigger(**trigger)
        .start()
    )


_stores: dict[tuple[str, int], EventStore] = {}


def _store(url: str, server_id: int) -> EventStore:
    """The destination store, opened once per driver."""
    key = (url, server_id)
    if key not in _stores:
        _stores[key] = EventStore(url, server_id=server_id)
    return _stores[key]


def _new_event(event: AggregatedEvent, prefix: tuple[str, ...]) -> NewEvent:
    return NewEvent(
        type=(*prefix, event.source, event.type),
        payload=event.data.encode(),
        payload_kind=PayloadKind.JSON,
        source_timestamp_us=event.ts_us,
        outbox_event_id=event.outbox_event_id,
    )


def _micros(value: Any) -> int:
    return int(value.timestamp() * 1_000_000)
