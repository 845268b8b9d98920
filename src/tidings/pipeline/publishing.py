"""What the publishing sink's tasks and its driver-side commit do (the sink's work).

A task reads its slice of the log chunk by chunk and runs the
:class:`~tidings.pipeline.publisher.Publisher` over each chunk, which publishes and records
every outcome in the event log as it goes. Publishing is safe to repeat: a batch that Spark
replays after a crash skips what is already PUBLISHED, re-sends only to unconfirmed targets,
and the targets deduplicate by event id. The commit appends the batch's summary to
``tidings_batch_log``: that is the relay's watermark, the replay job's boundary and what
``tidings status`` and the metrics read.

Apart from the Spark-facing classes (:mod:`tidings.pipeline.sink`), which load this module
only where it runs: the workers that merely plan a job stay small.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tidings.config import TidingsConfig
from tidings.db import shared_engine
from tidings.events.timeutil import utcnow
from tidings.outbox.schema import batch_log
from tidings.pipeline.jobconfig import job_config, started_config
from tidings.pipeline.logread import read_slice
from tidings.pipeline.outcome import Summary
from tidings.pipeline.publisher import Publisher
from tidings.pipeline.retry import RetryPolicy
from tidings.pipeline.source import LogSlice
from tidings.routing.table import current_routes
from tidings.targets.registry import shared_target


def publish_slices(options: Mapping[str, str], slices: Iterable[LogSlice]) -> Summary:
    """Publish a task's slices of the log (one, in practice), a chunk at a time: one run of
    the task's publisher per chunk (routes read once per task)."""
    config = job_config(options)
    engine = shared_engine(config.database.url)
    publisher = task_publisher(config, options)
    total = Summary()
    for part in slices:
        for chunk in read_slice(engine, part):
            total.merge(publisher.run(chunk))
    return total


def task_publisher(config: TidingsConfig, options: Mapping[str, str]) -> Publisher:
    """The publisher of one task, with the configuration and routes in force."""
    engine = shared_engine(config.database.url)

    def lookup(name: str):
        spec = config.targets.get(name)
        return None if spec is None else shared_target(name, spec)

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
    options: Mapping[str, str], job: str, batch_id: int, summaries: Iterable[dict[str, Any]]
) -> None:
    """Append the batch's summary (its tasks' summaries merged) to the batch log."""
    total = Summary()
    for summary in summaries:
        total.merge(Summary(**summary))
    if not total.events:
        return
    config = started_config(options)
    with shared_engine(config.database.url).begin() as conn:
        conn.execute(
            batch_log.insert().values(
                job=job,
                batch_id=batch_id,
                finished_at=utcnow(),
                max_seq=total.max_seq,
                summary=json.dumps(total.as_dict()),
            )
        )
