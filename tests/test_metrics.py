"""Prometheus metrics are fed from the batch log the relay's commits append to."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import REGISTRY

from tidings.db import make_engine
from tidings.events.timeutil import utcnow
from tidings.metrics import BatchLogFollower
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import batch_log
from tidings.pipeline.outcome import Summary


def _value(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_follower_turns_batch_summaries_into_metrics(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        tx.emit("Created", {})  # stays PENDING: the oldest-open gauge must see it
    follower = BatchLogFollower(engine)
    before = {
        n: _value(n)
        for n in (
            "tidings_events_published_total",
            "tidings_events_failed_total",
            "tidings_publish_retries_total",
            "tidings_publish_latency_seconds_count",
        )
    }
    summary = Summary(
        events=5,
        published=3,
        failed=1,
        held=1,
        retries=4,
        max_seq=5,
        latencies_ms=[12.0, 40.0, 300.0],
    )
    with engine.begin() as conn:
        conn.execute(
            batch_log.insert().values(
                job="relay",
                batch_id=0,
                finished_at=utcnow(),
                max_seq=5,
                summary=json.dumps(summary.as_dict()),
            )
        )
    assert len(follower.poll()) == 1
    assert _value("tidings_events_published_total") - before["tidings_events_published_total"] == 3
    assert _value("tidings_events_failed_total") - before["tidings_events_failed_total"] == 1
    assert _value("tidings_publish_retries_total") - before["tidings_publish_retries_total"] == 4
    assert (
        _value("tidings_publish_latency_seconds_count")
        - before["tidings_publish_latency_seconds_count"]
    ) == 3
    assert _value("tidings_oldest_pending_age_seconds") > 0
    assert follower.poll() == []  # each summary is counted once
