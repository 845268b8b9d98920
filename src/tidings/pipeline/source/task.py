"""What a relay or replay task publishes, and how the job's driver records the batch.

A task reads its slice of the log chunk by chunk and runs the
:class:`~tidings.pipeline.publishing.publisher.Publisher` over each chunk, which publishes and
records every outcome in the event log as it goes. Publishing is safe to repeat: a batch that Spark
replays after a crash skips what is already PUBLISHED, re-sends only to unconfirmed targets,
and the targets deduplicate by event id. The task yields its summary; the driver collects
the batch's summaries and appends them to ``tidings_batch_log``: that is the relay's
watermark, the replay job's boundary and what ``tidings status`` and the metrics read.

Loaded only where that work runs (the Spark-facing source,
:mod:`tidings.pipeline.source.datasource`, imports it in its tasks): the workers that merely
plan a job stay small.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tidings.config import TidingsConfig
from tidings.db import shared_engine
from tidings.events.timeutil import utcnow
from tidings.logs import configure_logging, process_age_s
from tidings.outbox.confirmations import ConfirmationLog
from tidings.outbox.schema import batch_log
from tidings.pipeline.jobconfig import job_config
from tidings.pipeline.publishing.outcome import Summary
from tidings.pipeline.publishing.publisher import Publisher
from tidings.pipeline.publishing.retry import RetryPolicy
from tidings.pipeline.source.queries import read_slice
from tidings.pipeline.source.slices import LogSlice
from tidings.pipeline.source.workerheap import collection_paused, freeze_heap
from tidings.pipeline.standby import check_fence
from tidings.routing.table import current_routes
from tidings.targets.base import Target
from tidings.targets.registry import shared_target

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)
_announced = False


def publish_task(options: Mapping[str, str], part: LogSlice) -> pa.RecordBatch:
    """A task's work: publish its slice, a chunk at a time (one run of the task's publisher
    per chunk, routes read once per task); its summary as the one-row batch it yields
    (:data:`~tidings.pipeline.source.slices.SCHEMA`)."""
    _worker_ready(options)
    config = job_config(options)
    engine = shared_engine(config.database.url)
    publisher = task_publisher(config, options)
    summary = Summary()
    with collection_paused():
        for chunk in read_slice(engine, part):
            check_fence(engine, options)  # a relay that lost its lease publishes no more
            summary.merge(publisher.run(chunk))
    batch = _one_text_row("summary", json.dumps(summary.as_dict()))
    freeze_heap()  # after the first task: the worker's imports and connections exist
    return batch


def warm_up_task(options: Mapping[str, str]) -> pa.RecordBatch:
    """A standby relay's warm-up task (:mod:`tidings.pipeline.warmup`): what
    :func:`publish_task` loads before its first chunk (the configuration, the engine, the
    routes, the publisher, the routed targets' clients), loaded in this worker for the relay
    query's first task; nothing read, nothing published. An empty summary."""
    _worker_ready(options)
    config = job_config(options)
    publisher = task_publisher(config, options)
    for name in publisher.routes.target_names():
        if (spec := config.targets.get(name)) is not None:
            shared_target(name, spec)
    batch = _one_text_row("summary", json.dumps(Summary().as_dict()))
    freeze_heap()
    return batch


def _worker_ready(options: Mapping[str, str]) -> None:
    """On a worker's first task: log as the driver does (``log_level``: Spark passes the
    worker's stderr on to the driver's), and say the worker is ready to publish, with the
    seconds since it started (its start and tidings' imports: a relay's first batch waits
    for them)."""
    global _announced
    if _announced:
        return
    _announced = True
    level = options.get("log_level")
    if level and not logging.getLogger("tidings").handlers:
        configure_logging(level)
    extra = {"since_start_s": process_age_s(), "warm_up": "warm_up" in options}
    log.info("relay task worker ready", extra=extra)


def _one_text_row(name: str, text: str) -> pa.RecordBatch:
    """A one-row, one-column batch of ``text``, built from raw buffers: converting Python
    objects makes pyarrow import pandas, 50 MiB more in every task worker."""
    import pyarrow as pa  # only in the tasks: the driver, which records batches, needs none

    data = text.encode()
    offsets = pa.py_buffer(struct.pack("<ii", 0, len(data)))
    column = pa.StringArray.from_buffers(1, offsets, pa.py_buffer(data))
    return pa.RecordBatch.from_arrays([column], names=[name])


def task_publisher(config: TidingsConfig, options: Mapping[str, str]) -> Publisher:
    """The publisher of one task, with the configuration and routes in force."""
    engine = shared_engine(config.database.url)
    confirmations = ConfirmationLog(engine)

    def lookup(name: str) -> Target | None:
        spec = config.targets.get(name)
        if spec is None:
            return None
        target = shared_target(name, spec)
        target.attach_log(confirmations)  # where it reads what other processes confirmed
        return target

    deadline = None
    if options.get("deadline_epoch"):
        deadline = time.monotonic() + float(options["deadline_epoch"]) - time.time()
    replay = options.get("job") == "replay"
    return Publisher(
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


def record_batch(
    options: Mapping[str, str], job: str, batch_id: int, rows: Iterable[Any]
) -> Summary:
    """Append the batch's summary to the batch log, if it handled any event; return it.

    ``rows`` are what the job's driver collected of the batch (rows of
    :data:`~tidings.pipeline.source.slices.SCHEMA`, one per task: collecting them is what runs the
    tasks); their summaries are merged."""
    total = Summary()
    for row in rows:
        total.merge(Summary(**json.loads(row.summary)))
    if not total.events:
        return total
    with shared_engine(options["database_url"]).begin() as conn:
        conn.execute(
            batch_log.insert().values(
                job=job,
                batch_id=batch_id,
                finished_at=utcnow(),
                max_seq=total.max_seq,
                summary=json.dumps(total.as_dict()),
            )
        )
    return total
