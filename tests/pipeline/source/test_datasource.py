"""The log source's warm-up mode (a standby relay's, :mod:`tidings.pipeline.warmup`): a batch
every trigger, one slice that reads nothing, and a task that publishes nothing; planning it
touches no database. No Spark needed: these are the calls Spark makes; real SQLite files."""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql.streaming.datasource import ReadAllAvailable

from tests.support.helpers import relay_config, statuses, store_events
from tests.support.publisher_helpers import emit_all
from tidings.db import make_engine
from tidings.outbox.schema import ensure_schema
from tidings.pipeline.jobconfig import job_options
from tidings.pipeline.source.datasource import WARM_UP_OPTION, OutboxStreamReader
from tidings.pipeline.source.slices import LogSlice


def test_a_warm_up_stream_plans_a_batch_per_trigger_without_the_database() -> None:
    options = {
        WARM_UP_OPTION: "true",
        "database_url": "sqlite:////nonexistent-folder/app.db",  # any use of it would fail
        "partitions": "2",
        "max_events_per_batch": "100",
    }
    reader = OutboxStreamReader(options)
    start = reader.initialOffset()
    assert start == {"seq": 0, "carry": 0}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"seq": 0, "carry": 1}
    assert reader.latestOffset(end, ReadAllAvailable()) == {"seq": 0, "carry": 2}
    assert reader.partitions(start, end) == [LogSlice(0, 0, 0, 1)]


def test_a_warm_up_task_loads_the_publisher_and_publishes_nothing(tmp_path: Path) -> None:
    config = relay_config(tmp_path)
    engine = make_engine(config.database.url)
    ensure_schema(engine)
    emit_all(engine, [("Created", "k", {"n": n}) for n in range(3)])
    reader = OutboxStreamReader(job_options(config, None) | {WARM_UP_OPTION: "true"})

    (batch,) = reader.read(LogSlice(0, 3, 0, 1))  # a slice with events: still none read

    assert json.loads(batch.column(0)[0].as_py())["events"] == 0
    assert set(statuses(engine).values()) == {"PENDING"}
    assert store_events(config) == []
    engine.dispose()
