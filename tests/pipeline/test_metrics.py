"""The relay's Prometheus metrics: fed from the batch log the relay's commits append to,
labelled by target and event type with a bounded number of types, gauges from the health
report, and served on the configured address only."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from bench.harness.processes import free_port
from tests.support.helpers import relay_config, write_config
from tidings.cli import app
from tidings.config import load_config
from tidings.db import make_engine
from tidings.errors import ConfigError
from tidings.events.timeutil import utcnow
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import batch_log
from tidings.pipeline.metrics import OTHER, BatchLogFollower, LabelCap, RelayMetrics, serve_metrics
from tidings.pipeline.publishing.outcome import Summary
from tidings.routing.table import merge_routes


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _append(engine, summary: Summary, job: str = "relay") -> None:
    with engine.begin() as conn:
        conn.execute(
            batch_log.insert().values(
                job=job,
                batch_id=0,
                finished_at=utcnow(),
                max_seq=summary.max_seq,
                summary=json.dumps(summary.as_dict()),
            )
        )


def test_follower_turns_batch_summaries_into_labelled_metrics(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        tx.emit("Created", {})  # stays PENDING: the open and oldest-open gauges must see it
    metrics = RelayMetrics()
    follower = BatchLogFollower(engine, metrics, lambda: merge_routes({"Created": ["store"]}))
    summary = Summary(
        events=5,
        published=3,
        failed=1,
        held=1,
        unroutable=1,
        retries=4,
        max_seq=5,
        latencies_ms=[12.0, 40.0, 300.0],
        latency_types=["Created", "Created", "Renamed"],
        published_to={"store": {"Created": 2, "Renamed": 1}, "bus": {"Created": 2}},
        failed_at={"bus": {"Renamed": 1}},
        unroutable_types={"Nope": 1},
    )
    _append(engine, summary)
    assert [s.published for s in follower.poll()] == [3]
    r = metrics.registry
    assert _value(r, "tidings_events_published_total") == 3
    assert _value(r, "tidings_events_failed_total") == 1
    assert _value(r, "tidings_publish_retries_total") == 4
    assert (
        _value(r, "tidings_target_events_published_total", target="store", event_type="Created")
        == 2
    )
    assert (
        _value(r, "tidings_target_events_published_total", target="bus", event_type="Created") == 2
    )
    assert _value(r, "tidings_target_events_failed_total", target="bus", event_type="Renamed") == 1
    assert _value(r, "tidings_events_unroutable_total", event_type="Nope") == 1
    assert _value(r, "tidings_publish_latency_seconds_count", event_type="Created") == 2
    assert _value(r, "tidings_publish_latency_seconds_count", event_type="Renamed") == 1
    # gauges: the PENDING event, nothing HELD or FAILED, and the relay never logged seq 1
    assert _value(r, "tidings_open_events", status="PENDING") == 1
    assert _value(r, "tidings_open_events", status="FAILED") == 0
    assert _value(r, "tidings_oldest_open_age_seconds", status="PENDING") > 0
    assert _value(r, "tidings_target_open_events", target="store", state="pending") == 1
    assert _value(r, "tidings_relay_lag_events") == 0  # the batch logged max_seq 5 >= seq 1
    assert 0 <= _value(r, "tidings_relay_last_batch_age_seconds") < 60
    assert follower.poll() == []  # each summary is counted once
    assert follower.total.published == 3 and follower.total.published_to["store"]["Created"] == 2


def test_event_type_labels_are_capped(tmp_path: Path) -> None:
    cap = LabelCap(2)
    assert [cap(t) for t in ("A", "B", "C", "A", "D")] == ["A", "B", OTHER, "A", OTHER]
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    metrics = RelayMetrics(max_event_types=2)
    follower = BatchLogFollower(engine, metrics)
    _append(
        engine,
        Summary(events=4, published=4, max_seq=4, published_to={"s": {t: 1 for t in "ABCD"}}),
    )
    follower.poll()
    labelled = {
        s.labels["event_type"]: s.value
        for m in metrics.registry.collect()
        if m.name == "tidings_target_events_published"
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert labelled == {"A": 1, "B": 1, OTHER: 2}


def test_summaries_of_an_older_relay_still_count(tmp_path: Path) -> None:
    """A batch log written before the per-target fields existed is read without error."""
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    metrics = RelayMetrics()
    follower = BatchLogFollower(engine, metrics)
    old = {k: v for k, v in Summary(events=2, published=1, unroutable=1).as_dict().items()}
    for key in ("published_to", "failed_at", "unroutable_types", "latency_types"):
        del old[key]
    old["latencies_ms"] = [5.0]
    with engine.begin() as conn:
        conn.execute(
            batch_log.insert().values(
                job="relay", batch_id=1, finished_at=utcnow(), max_seq=2, summary=json.dumps(old)
            )
        )
    follower.poll()
    assert _value(metrics.registry, "tidings_events_published_total") == 1
    assert _value(metrics.registry, "tidings_events_unroutable_total", event_type=OTHER) == 1
    assert _value(metrics.registry, "tidings_publish_latency_seconds_count", event_type=OTHER) == 1


def test_metrics_are_served_on_the_configured_address_only() -> None:
    assert load_config({}).metrics.address == "127.0.0.1"
    metrics = RelayMetrics()
    metrics.published.inc(7)
    port = free_port()
    serve_metrics(metrics.registry, port, "127.0.0.1")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "tidings_events_published_total 7.0" in body
    with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
        serve_metrics(RelayMetrics().registry, port, "127.0.0.1")  # the port is taken


def test_metrics_config_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"metrics\.max_event_types"):
        load_config({"metrics": {"max_event_types": 0}})
    with pytest.raises(ConfigError, match=r"metrics\.port"):
        load_config({"metrics": {"port": 70000}})


def test_relay_refuses_a_metrics_port_it_cannot_bind(tmp_path: Path) -> None:
    """One line and exit 2, before Spark starts (the port is held by a real socket)."""
    path = write_config(relay_config(tmp_path), tmp_path / "tidings.yaml")
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        result = CliRunner().invoke(
            app, ["relay", "-c", str(path), "--metrics-port", str(port), "--once"]
        )
    assert result.exit_code == 2
    assert (
        result.output.strip()
        == f"error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    )
