"""``tidings status``: the health report is right, reads only through indexes, and
``--json`` / ``--check`` say so to machines (exit codes 0 healthy, 1 unhealthy, 2 cannot
read)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, update
from typer.testing import CliRunner

from tests.conftest import LOG_BACKENDS
from tests.support.helpers import relay_config, write_config
from tests.support.query_plans import reads, sqlite_plans
from tidings.cli import app
from tidings.db import make_engine
from tidings.events.timeutil import utcnow
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import batch_log, outbox_event
from tidings.pipeline.status import health_problems, health_report
from tidings.routing.table import merge_routes

runner = CliRunner()
ROUTES = merge_routes({"Created": ["store", "bus"]})
HOUR = timedelta(hours=1)


def _set(engine: Engine, seqs: list[int], **values: object) -> None:
    with engine.begin() as conn:
        conn.execute(update(outbox_event).where(outbox_event.c.seq.in_(seqs)).values(**values))


def _log_batch(engine: Engine, max_seq: int, ago: timedelta, job: str = "relay") -> None:
    with engine.begin() as conn:
        conn.execute(
            batch_log.insert().values(
                job=job, batch_id=max_seq, finished_at=utcnow() - ago, max_seq=max_seq, summary="{}"
            )
        )


def _build_log(engine: Engine) -> None:
    """seq 1-4 PUBLISHED; key a: 5 FAILED at bus, 6 HELD behind it at bus; key b: 7 PARKED,
    8 PENDING; 9-10 UNROUTABLE 'Nope'; 11 PENDING. The relay logged batches up to seq 9."""
    outbox = Outbox(engine)
    keys = ["p", "p", "p", "p", "a", "a", "b", "b", None, None, "c"]
    with outbox.transaction() as tx:
        for i, key in enumerate(keys):
            tx.emit("Nope" if i in (8, 9) else "Created", {"i": i}, partition_key=key)
    confirmed = '{"store":{"state":"confirmed"},"bus":{"state":"confirmed"}}'
    _set(engine, [1, 2, 3, 4], status="PUBLISHED", deliveries=confirmed)
    _set(
        engine,
        [5],
        status="FAILED",
        error_details='{"bus": "refused: poison"}',
        deliveries='{"store":{"state":"confirmed"},"bus":{"state":"failed","error":"poison"}}',
        logged_at=utcnow() - HOUR,
        updated_at=utcnow(),
    )
    _set(engine, [6], status="HELD", error_details="bus: held behind unpublished seq 5")
    _set(engine, [7], status="PARKED", error_details="parked: poison")
    _set(engine, [9, 10], status="UNROUTABLE", error_details="no route for event type 'Nope'")
    _log_batch(engine, 4, 3 * HOUR)
    _log_batch(engine, 9, 2 * HOUR)
    _log_batch(engine, 11, timedelta(0), job="replay")  # not the relay's watermark


@pytest.mark.parametrize("backend", LOG_BACKENDS)
def test_report_counts_what_is_not_published(backend: str, request, tmp_path: Path) -> None:
    fixture = {"postgresql": "pg_url", "mysql": "mysql_url"}.get(backend)
    url = request.getfixturevalue(fixture) if fixture else None
    engine = make_engine(url or f"sqlite:///{tmp_path / 'app.db'}")
    _build_log(engine)
    report = health_report(engine, ROUTES, errors=5)
    assert report.counts == {"FAILED": 1, "HELD": 1, "PARKED": 1, "PENDING": 2, "UNROUTABLE": 2}
    assert report.open_events == 4
    assert report.unroutable_by_type == {"Nope": 2}
    figures = {name: vars(f) for name, f in report.targets.items()}
    assert figures == {
        # 6 and 7 owe both targets (6 is held only at bus), 8 and 11 are fresh PENDING.
        "store": {"pending": 3, "held": 0, "failed": 0, "parked": 1},
        "bus": {"pending": 2, "held": 1, "failed": 1, "parked": 1},
    }
    assert report.keys_held_behind_failed == 1  # key a
    assert (report.newest_seq, report.relayed_seq, report.lag_events) == (11, 9, 2)
    assert 2 * 3600 - 60 < report.last_batch_age_seconds < 2 * 3600 + 60
    assert 0 <= report.lag_seconds < 60  # seq 10 was logged just now
    assert 3600 - 60 < report.oldest_age_seconds["FAILED"] < 3600 + 60
    assert report.oldest_open_age_seconds == report.oldest_age_seconds["FAILED"]
    assert [(e.seq, e.error) for e in report.last_errors] == [(5, '{"bus": "refused: poison"}')]
    assert health_report(engine, ROUTES, errors=0).last_errors == []


def test_report_reads_the_log_only_through_indexes(tmp_path: Path) -> None:
    """Every SELECT of the report, as SQLite plans it, searches an index or the primary key:
    none scans outbox_event or the batch log (the report must stay cheap on a 10M-row log)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    _build_log(engine)
    plans = sqlite_plans(engine, lambda: health_report(engine, ROUTES))
    assert len(plans) == 6
    for statement, plan in plans:
        steps = reads(plan)
        assert steps and all(step.startswith("SEARCH") for step in steps), (statement, plan)


def test_problems_name_each_reason(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    _build_log(engine)
    report = health_report(engine, ROUTES)
    assert health_problems(report) == [
        "1 FAILED events (oldest 3600 s)",
        "1 PARKED events (oldest 0 s)",
    ]
    _set(engine, [5], status="PUBLISHED")
    _set(engine, [7], status="PUBLISHED")
    _set(engine, [10, 11], logged_at=utcnow() - HOUR)  # waited an hour, no batch for two
    report = health_report(engine, ROUTES)
    assert (
        health_problems(report, max_lag=5, max_lag_seconds=7200, max_batch_age_seconds=7200) == []
    )
    problems = health_problems(report, max_lag=1, max_lag_seconds=600, max_batch_age_seconds=600)
    assert problems == [
        "relay lag 2 events > 1",
        "relay lag 3600 s > 600 s",
        "relay last batch 7200 s ago while 2 events wait (> 600 s)",
    ]


def _cli_setup(tmp_path: Path) -> tuple[Path, Engine]:
    config = relay_config(tmp_path, routes={"Created": ["store"]})
    engine = make_engine(config.database.url)
    return write_config(config, tmp_path / "tidings.yaml"), engine


def test_cli_json_and_check(tmp_path: Path) -> None:
    path, engine = _cli_setup(tmp_path)
    _build_log(engine)
    result = runner.invoke(app, ["status", "-c", str(path), "--json", "--errors", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["counts"] == {"PENDING": 2, "HELD": 1, "FAILED": 1, "UNROUTABLE": 2, "PARKED": 1}
    assert data["relay"]["lag_events"] == 2 and data["relay"]["relayed_seq"] == 9
    assert data["unroutable_by_type"] == {"Nope": 2}
    assert data["keys_held_behind_failed"] == 1
    assert [e["seq"] for e in data["last_errors"]] == [5]
    # bus is not configured here; deliveries still name it, so it is counted
    assert data["targets"]["bus"]["failed"] == 1

    check = runner.invoke(app, ["status", "-c", str(path), "--check"])
    assert check.exit_code == 1
    assert check.output.splitlines() == [
        "1 FAILED events (oldest 3600 s)",
        "1 PARKED events (oldest 0 s)",
    ]
    table = runner.invoke(app, ["status", "-c", str(path)])
    assert table.exit_code == 0 and "lag 2 events" in table.output and "Nope" in table.output

    _set(engine, [5, 7], status="PUBLISHED")
    healthy = runner.invoke(app, ["status", "-c", str(path), "--check"])
    assert (healthy.exit_code, healthy.output.strip()) == (0, "healthy")
    lagging = runner.invoke(app, ["status", "-c", str(path), "--check", "--max-lag", "1"])
    assert (lagging.exit_code, lagging.output.strip()) == (1, "relay lag 2 events > 1")


def test_cli_unreadable_database_is_one_line_exit_2(tmp_path: Path) -> None:
    config = relay_config(tmp_path, database_url="postgresql://nobody@127.0.0.1:1/none")
    path = write_config(config, tmp_path / "tidings.yaml")
    result = runner.invoke(app, ["status", "-c", str(path), "--check"])
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_cli_bad_threshold_is_a_usage_error(tmp_path: Path) -> None:
    path, _ = _cli_setup(tmp_path)
    result = runner.invoke(app, ["status", "-c", str(path), "--check", "--max-batch-age", "soon"])
    assert result.exit_code == 2 and "not a duration" in result.output
