"""A relay or replay task publishes its slice where it runs and yields one row, its summary;
the job's driver records the batch from those rows (no Spark needed: these are the
functions the task and the driver call; the relay tests run them inside Spark). Real
SQLite files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pyspark.sql import Row
from sqlalchemy import select

from tests.support.helpers import relay_config, statuses, store_events
from tests.support.publisher_helpers import emit_all
from tidings.db import make_engine
from tidings.outbox.schema import batch_log, ensure_schema
from tidings.pipeline.jobconfig import job_options
from tidings.pipeline.source.slices import LogSlice
from tidings.pipeline.source.task import publish_task, record_batch


def test_a_task_publishes_its_slice_and_the_driver_records_the_batch(tmp_path: Path) -> None:
    config = relay_config(tmp_path)
    engine = make_engine(config.database.url)
    ensure_schema(engine)
    emit_all(engine, [("Created", f"k{i % 3}", {"n": i}) for i in range(7)])
    options = job_options(config, None)

    batches = [publish_task(options, LogSlice(0, 7, index, 2)) for index in range(2)]

    assert [b.schema.names for b in batches] == [["summary"], ["summary"]]
    assert [b.num_rows for b in batches] == [1, 1]
    rows = [Row(summary=text) for b in batches for text in b.column(0).to_pylist()]
    assert sum(json.loads(row.summary)["published"] for row in rows) == 7
    assert set(statuses(engine).values()) == {"PUBLISHED"}
    assert len(store_events(config)) == 7

    total = record_batch(options, "relay", 41, rows)
    assert (total.events, total.published, total.max_seq) == (7, 7, 7)
    with engine.connect() as conn:
        logged = conn.execute(select(batch_log.c.batch_id, batch_log.c.summary)).all()
    assert [(row.batch_id, json.loads(row.summary)["published"]) for row in logged] == [(41, 7)]
    engine.dispose()


def test_a_batch_that_handled_nothing_is_not_logged(tmp_path: Path) -> None:
    config = relay_config(tmp_path)
    engine = make_engine(config.database.url)
    ensure_schema(engine)
    options = job_options(config, None)
    rows = [Row(summary=publish_task(options, LogSlice(0, 0, 0, 1)).column(0)[0].as_py())]
    assert record_batch(options, "relay", 1, rows).events == 0
    with engine.connect() as conn:
        assert conn.execute(select(batch_log.c.id)).all() == []
    engine.dispose()


def test_the_summary_row_is_built_without_pandas() -> None:
    """pyarrow imports pandas when it converts Python objects: 50 MiB more in every task
    worker. The row is built from raw buffers instead."""
    code = (
        "import sys\n"
        "from tidings.pipeline.source.task import _one_text_row\n"
        "batch = _one_text_row('summary', '{\"x\": 1}')\n"
        "assert batch.column(0).to_pylist() == ['{\"x\": 1}']\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
