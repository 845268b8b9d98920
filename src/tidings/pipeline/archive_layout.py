"""The layout of tidings' Parquet archives, one definition for the two jobs that write one.

Housekeeping archives the outbox's published events before it deletes them
(:mod:`tidings.pipeline.housekeeping`, a chunk at a time through Hadoop's file system), and
``tidings streams archive`` archives an FTN18 stream's events (through Spark's file sink).
Both write Parquet partitioned Hive-style by the event's UTC day, then by its type
(``day=2024-05-01/event_type=OrderPlaced``, ``day=2024-05-01/type=quote``), so one reader
and one retention rule serve both. Paths whose name starts with ``_`` are not part of the
archive, and Spark's and Parquet's readers skip them: housekeeping stages each chunk under
:data:`STAGING_DIR` before its rows are deleted, Spark's file sink keeps its commit log in
``_spark_metadata``. A file housekeeping moves in is named after its chunk
(:func:`archived_file`), so the chunks' files never collide.

The rows: an outbox archive holds every column of ``outbox_event``, the event's attributes
as one JSON object and the ``day`` (:data:`OUTBOX_SCHEMA`); a stream archive holds the
stream source's rows (id, type, data, ts) and the ``day``.

Readers of an archive should turn off Spark's partition type inference
(``spark.sql.sources.partitionColumnTypeInference.enabled=false``) if event types can look
like numbers.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F

from tidings.events.timeutil import as_utc
from tidings.outbox.schema import outbox_event

#: The first partition column: the event's day, UTC, as ``yyyy-mm-dd``.
DAY = "day"
_DAY_FORMAT = "%Y-%m-%d"
_SPARK_DAY_FORMAT = "yyyy-MM-dd"  # the same, in Spark's pattern language
#: The partition columns of an outbox archive and of a stream archive.
OUTBOX_PARTITIONS = (DAY, "event_type")
STREAM_PARTITIONS = (DAY, "type")
#: Where housekeeping stages a chunk before its rows are deleted (readers skip ``_`` paths).
STAGING_DIR = "_staging"

_ARROW_TYPES: dict[type, pa.DataType] = {
    int: pa.int64(),
    str: pa.string(),
    datetime: pa.timestamp("us", tz="UTC"),
}
#: Every column of ``outbox_event``, then the event's attributes as a JSON object and the
#: ``day`` partition column.
OUTBOX_SCHEMA = pa.schema(
    [(c.name, _ARROW_TYPES[c.type.python_type]) for c in outbox_event.columns]
    + [("attributes", pa.string()), (DAY, pa.string())]
)


def day_of(moment: datetime) -> str:
    """The ``day`` partition of an event logged at ``moment`` (naive means UTC)."""
    return as_utc(moment).strftime(_DAY_FORMAT)


def day_column(timestamp: str) -> Column:
    """The ``day`` partition of a Spark timestamp column, in the session's time zone (UTC
    on the sessions of :func:`tidings.pipeline.spark.spark_session`)."""
    return F.date_format(timestamp, _SPARK_DAY_FORMAT)


def staged_chunk(root: str, first_seq: int, last_seq: int) -> str:
    """Where housekeeping stages the chunk of ``first_seq`` to ``last_seq``."""
    return f"{root}/{STAGING_DIR}/chunk-{first_seq}-{last_seq}"


def archived_file(root: str, partition: str, chunk: str, name: str) -> str:
    """Where a staged file ``name`` of ``chunk`` goes: its ``partition``
    (``/day=.../event_type=...``) under ``root``, named after the chunk."""
    return f"{root}{partition}/{chunk}-{name}"
