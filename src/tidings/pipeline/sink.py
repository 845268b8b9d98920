"""The publishing sink (``tidings_publish``): Spark tasks hand it slices of the log.

Each task reads its slice's rows (the source only says which slice: the rows do not travel
through the JVM from one Python worker to another), turns them into
:class:`~tidings.pipeline.outcome.LoggedEvent` and runs the
:class:`~tidings.pipeline.publisher.Publisher`, which publishes and records every outcome in
the event log as it goes. Publishing in ``write()`` is safe to repeat: a batch that Spark
replays after a crash skips what is already PUBLISHED, re-sends only to unconfirmed targets,
and the targets deduplicate by event id. The driver-side ``commit()`` appends the batch's
summary to ``tidings_batch_log``: that is the relay's watermark, the replay job's boundary
and what ``tidings status`` and the metrics read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from tidings.config import TidingsConfig
from tidings.db import shared_engine
from tidings.events.timeutil import utcnow
from tidings.outbox.schema import batch_log
from tidings.pipeline.jobconfig import job_config, started_config
from tidings.pipeline.outcome import LoggedEvent, Summary
from tidings.pipeline.publisher import Publisher
from tidings.pipeline.retry import RetryPolicy
from tidings.pipeline.source import LogSlice, read_slice
from tidings.routing.table import current_routes
from tidings.targets.registry import shared_target


@dataclass
class SummaryMessage(WriterCommitMessage):
    summary: dict[str, Any]


def publish_rows(
    config: TidingsConfig, rows: list[LoggedEvent], options: Mapping[str, str]
) -> Summary:
    """Run the publisher over one task's rows with the configuration in force."""
    engine = shared_engine(config.database.url)

    def lookup(name: str):
        spec = config.targets.get(name)
        return None if spec is None else shared_target(name, spec)

    deadline = None
    if options.get("deadline_epoch"):
        deadline = time.monotonic() + float(options["deadline_epoch"]) - time.time()
    replay = options.get("job") == "replay"
    publisher = Publisher(
        engine,
        current_routes(config, engine),
        lookup,
        RetryPolicy.of(config.relay.retry),
        retry_threshold=int(options.get("retry_threshold") or config.replay.retry_count_threshold),
        deadline=deadline,
        delete_published=config.housekeeping.delete_on_success,
        # The relay waits for each retry's pause and stops after the last try; a replay
        # tries an event that failed in an earlier run at once, below the threshold.
        resume_delays=not replay,
    )
    return publisher.run(rows)


class _PublishWriter:
    """Shared by the batch (replay) and streaming (relay) writers."""

    job = "relay"

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SummaryMessage:
        """Read this task's slices of the log (one, in practice) and publish them."""
        config = job_config(self.options)
        engine = shared_engine(config.database.url)
        slices = [LogSlice.from_json(text) for b in iterator for text in b.column(0).to_pylist()]
        total = Summary()
        for part in slices:
            for chunk in read_slice(engine, part):
                total.merge(publish_rows(config, chunk, self.options))
        return SummaryMessage(total.as_dict())

    def _record(self, messages: list[Any], batch_id: int) -> None:
        total = Summary()
        for message in messages:
            if isinstance(message, SummaryMessage):
                total.merge(Summary(**message.summary))
        if not total.events:
            return
        config = started_config(self.options)
        with shared_engine(config.database.url).begin() as conn:
            conn.execute(
                batch_log.insert().values(
                    job=self.options.get("job", self.job),
                    batch_id=batch_id,
                    finished_at=utcnow(),
                    max_seq=total.max_seq,
                    summary=json.dumps(total.as_dict()),
                )
            )


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
        return PublishStreamWriter(self.options)
