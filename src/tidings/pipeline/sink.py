"""The publishing sink (``tidings_publish``): Spark tasks hand it slices of the log.

Each task gets its slice (one row, from :mod:`tidings.pipeline.source`), reads the rows and
publishes them; the driver-side commit records the batch
(:mod:`tidings.pipeline.publishing`, loaded only where that work runs: the workers that
merely plan the job load nothing but PySpark's data source API).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from tidings.pipeline.source import LogSlice
from tidings.pipeline.workerheap import freeze_heap

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class SummaryMessage(WriterCommitMessage):
    summary: dict[str, Any]


class _PublishWriter:
    """Shared by the batch (replay) and streaming (relay) writers."""

    job = "relay"

    def __init__(self, options: dict[str, str]) -> None:
        self.options = dict(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SummaryMessage:
        from tidings.pipeline.publishing import publish_slices

        slices = [LogSlice.from_json(text) for b in iterator for text in b.column(0).to_pylist()]
        message = SummaryMessage(publish_slices(self.options, slices).as_dict())
        freeze_heap()
        return message

    def _record(self, messages: list[Any], batch_id: int) -> None:
        from tidings.pipeline.publishing import record_batch

        summaries = [m.summary for m in messages if isinstance(m, SummaryMessage)]
        record_batch(self.options, self.options.get("job", self.job), batch_id, summaries)
        freeze_heap()


class PublishStreamWriter(_PublishWriter, DataSourceStreamArrowWriter):
    def commit(self, messages: list[Any], batchId: int) -> None:
        self._record(messages, batchId)


class PublishBatchWriter(_PublishWriter, DataSourceArrowWriter):
    job = "replay"

    def commit(self, messages: list[Any]) -> None:
        self._record(messages, int(time.time() * 1000))


class PublishSink(DataSource):
    """``df.writeStream.format("tidings_publish")`` / ``df.write.format(...)``."""

    @classmethod
    def name(cls) -> str:
        return "tidings_publish"

    def writer(self, schema: object, overwrite: bool) -> PublishBatchWriter:
        return PublishBatchWriter(self.options)

    def streamWriter(self, schema: object, overwrite: bool) -> PublishStreamWriter:
        writer = PublishStreamWriter(self.options)
        freeze_heap()  # this planning worker is reused for every micro-batch
        return writer
