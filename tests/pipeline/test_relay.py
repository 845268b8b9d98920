"""The relay and replay jobs on a real local SparkSession and real SQLite / PostgreSQL (and
MariaDB: the replay here, the rest in test_mysql_log.py)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import Engine, select, text

from tests.support.helpers import relay_config, statuses, store_events, store_target, write_config
from tests.support.waiting import wait_until
from tidings.config import TidingsConfig
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.relay_query import start_relay
from tidings.pipeline.replay import ReplayLimits, run_replay
from tidings.routing.table import add_route

pytestmark = pytest.mark.spark


def _emit(outbox: Outbox, event_type: str, key: str | None, n: int = 1) -> list[str]:
    ids = []
    for i in range(n):
        with outbox.transaction() as tx:
            ids.append(tx.emit(event_type, {"i": i}, partition_key=key))
    return ids


def test_streaming_relay_routes_and_reloads_routes_without_restart(spark, tmp_path: Path) -> None:
    config = relay_config(tmp_path, routes={"Created": ["store"]})
    path = write_config(config, tmp_path / "tidings.yaml")
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    query = start_relay(spark, config, str(path))
    try:
        _emit(outbox, "Created", "k", 3)
        _emit(outbox, "Renamed", "k")
        wait_until(lambda: set(statuses(engine).values()) == {"PUBLISHED", "UNROUTABLE"})
        assert statuses(engine)[4] == "UNROUTABLE"
        # A route added to the database table takes effect on the next micro-batch.
        add_route(engine, "Renamed", "store")
        _emit(outbox, "Renamed", "k")
        wait_until(lambda: statuses(engine).get(5) == "PUBLISHED")
        # So does a route added to the YAML file.
        data = yaml.safe_load(path.read_text())
        data["routing"]["routes"]["Deleted"] = ["store"]
        path.write_text(yaml.safe_dump(data))
        _emit(outbox, "Deleted", "k")
        wait_until(lambda: statuses(engine).get(6) == "PUBLISHED")
    finally:
        query.stop()
    types = [e.type for e in store_events(config)]
    assert types == [("t", "Created")] * 3 + [("t", "Renamed"), ("t", "Deleted")]


def test_restart_from_checkpoint_resumes_without_loss_or_duplicate(spark, tmp_path: Path) -> None:
    config = relay_config(tmp_path, max_events_per_batch=7)
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    _emit(outbox, "Created", "a", 20)
    start_relay(spark, config, available_now=True).awaitTermination()
    _emit(outbox, "Created", "a", 5)
    start_relay(spark, config, available_now=True).awaitTermination()
    assert set(statuses(engine).values()) == {"PUBLISHED"}
    stored = store_events(config)
    assert len(stored) == 25
    assert len({e.outbox_event_id for e in stored}) == 25
    with engine.connect() as conn:
        logged = conn.execute(select(outbox_event.c.event_id).order_by(outbox_event.c.seq)).all()
    assert [e.outbox_event_id for e in stored] == [r[0] for r in logged]


def test_each_start_logs_its_first_batch_planned_and_recorded(
    spark, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """How long a start (a standby's takeover) took to publish is read from these lines."""
    config = relay_config(tmp_path, max_events_per_batch=7)
    outbox = Outbox(make_engine(config.database.url))
    _emit(outbox, "Created", "a", 20)
    with caplog.at_level(logging.INFO, logger="tidings.pipeline.relay_query"):
        start_relay(spark, config, available_now=True).awaitTermination()
        _emit(outbox, "Created", "a", 5)
        start_relay(spark, config, available_now=True).awaitTermination()
    firsts = [
        (r.getMessage(), r.__dict__["batch_id"], r.__dict__.get("published"))
        for r in caplog.records
        if r.getMessage().startswith("relay first batch")
    ]
    assert firsts == [
        ("relay first batch planned", 0, None),
        ("relay first batch recorded", 0, 7),
        ("relay first batch planned", 3, None),
        ("relay first batch recorded", 3, 5),
    ]


def _store_down(
    tmp_path: Path, database_url: str | None = None
) -> tuple[TidingsConfig, Path, Engine, Outbox]:
    """A relay to an event store whose fault file says it is down (one retry, 1 ms); the
    log in ``database_url`` (a SQLite file if None)."""
    fault = tmp_path / "store.fault"
    config = relay_config(
        tmp_path,
        database_url,
        targets={"store": store_target(tmp_path, fault_file=str(fault))},
        retry={"backoff": ["1ms"]},
    )
    fault.write_text("down")
    engine = make_engine(config.database.url)
    return config, fault, engine, Outbox(engine)


@pytest.mark.parametrize(
    "server", ["sqlite", pytest.param("mysql_url", marks=pytest.mark.mysql, id="mysql")]
)
def test_replay_delivers_failed_and_held_in_order_within_limits(
    spark, tmp_path: Path, request: pytest.FixtureRequest, server: str
) -> None:
    url = None if server == "sqlite" else request.getfixturevalue(server)
    config, fault, engine, outbox = _store_down(tmp_path, url)
    for key in ("a", "b", "a", "b", "a"):
        _emit(outbox, "Created", key)
    start_relay(spark, config, available_now=True).awaitTermination()
    assert statuses(engine) == {1: "FAILED", 2: "FAILED", 3: "HELD", 4: "HELD", 5: "HELD"}
    fault.unlink()
    limits = ReplayLimits(
        older_than=ReplayLimits.from_config(config).older_than * 0,
        retry_count_threshold=50,
        time_limit=ReplayLimits.from_config(config).time_limit,
        event_limit=3,
    )
    done = run_replay(spark, config, limits=limits)
    assert done.published == 3
    assert statuses(engine) == {
        1: "PUBLISHED",
        2: "PUBLISHED",
        3: "PUBLISHED",
        4: "HELD",
        5: "HELD",
    }
    # Nothing younger than the threshold is touched.
    young = ReplayLimits(
        limits.older_than + ReplayLimits.from_config(config).time_limit, 50, limits.time_limit, 100
    )
    assert run_replay(spark, config, limits=young).events == 0
    # A time limit already spent starts no work.
    spent = ReplayLimits(limits.older_than, 50, limits.time_limit * 0, 100)
    assert run_replay(spark, config, limits=spent).published == 0
    run_replay(spark, config, limits=ReplayLimits(limits.older_than, 50, limits.time_limit, 100))
    assert set(statuses(engine).values()) == {"PUBLISHED"}
    keys = {1: "a", 2: "b", 3: "a", 4: "b", 5: "a"}
    with engine.connect() as conn:
        seq_of = dict(conn.execute(select(outbox_event.c.event_id, outbox_event.c.seq)).all())
    order = [seq_of[e.outbox_event_id] for e in store_events(config)]
    assert [s for s in order if keys[s] == "a"] == [1, 3, 5]
    assert [s for s in order if keys[s] == "b"] == [2, 4]


def test_a_stuck_key_does_not_eat_the_replay_limit(spark, tmp_path: Path) -> None:
    """A key whose FAILED event is past the retry threshold is skipped as a whole: its 30
    held events would otherwise fill a replay's event limit and the others would starve."""
    config, fault, engine, outbox = _store_down(tmp_path)
    _emit(outbox, "Created", "stuck", 31)
    for key in ("k0", "k1", "k2"):
        _emit(outbox, "Created", key)
    start_relay(spark, config, available_now=True).awaitTermination()
    assert [statuses(engine)[s] for s in (1, 2, 32, 33, 34)] == ["FAILED", "HELD"] + ["FAILED"] * 3
    with engine.begin() as conn:  # a long history of failed tries, as a month of replays leaves
        conn.execute(text("UPDATE outbox_event SET retry_count = 50 WHERE seq = 1"))
    fault.unlink()
    base = ReplayLimits.from_config(config)
    limits = ReplayLimits(base.older_than * 0, 20, base.time_limit, event_limit=3)
    done = run_replay(spark, config, limits=limits)
    assert (done.events, done.published) == (3, 3)
    rows = statuses(engine)
    assert [rows[s] for s in (32, 33, 34)] == ["PUBLISHED"] * 3
    assert rows[1] == "FAILED" and {rows[s] for s in range(2, 32)} == {"HELD"}


@pytest.mark.postgres
def test_postgres_rows_committed_out_of_order_are_not_skipped(
    spark, tmp_path: Path, pg_url: str
) -> None:
    config = relay_config(tmp_path, pg_url)
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    _emit(outbox, "Created", "warm")
    query = start_relay(spark, config)
    try:
        wait_until(lambda: set(statuses(engine).values()) == {"PUBLISHED"})
        # Writer 1 takes the lower seq and commits last; writer 2 takes the next one and
        # commits at once, while the relay keeps polling.
        slow_started, release = threading.Event(), threading.Event()

        def slow_writer() -> None:
            with outbox.transaction() as tx:
                tx.emit("Created", {"who": "slow"}, partition_key="slow")
                slow_started.set()
                release.wait(30)

        thread = threading.Thread(target=slow_writer)
        thread.start()
        slow_started.wait(10)
        with outbox.transaction() as tx:
            tx.emit("Created", {"who": "fast"}, partition_key="fast")
        for _ in range(10):  # several micro-batches pass while seq 2 is invisible
            time.sleep(0.2)
            assert statuses(engine).get(3) in ("PENDING", None)
        release.set()
        thread.join()
        wait_until(lambda: statuses(engine) == {1: "PUBLISHED", 2: "PUBLISHED", 3: "PUBLISHED"})
    finally:
        query.stop()
    with engine.connect() as conn:
        seq_of = dict(conn.execute(select(outbox_event.c.event_id, outbox_event.c.seq)).all())
    assert [seq_of[e.outbox_event_id] for e in store_events(config)] == [1, 2, 3]


@pytest.mark.postgres
def test_postgres_watermark_waits_for_in_flight_transactions(pg_url: str) -> None:
    """The reader's bound never passes a seq held by an uncommitted transaction."""
    from tidings.outbox.schema import ensure_schema
    from tidings.pipeline.source.watermark import SafeWatermark

    engine = make_engine(pg_url)
    ensure_schema(engine)
    outbox = Outbox(engine)
    watermark = SafeWatermark(engine)
    with engine.connect() as slow:
        slow_tx = slow.begin()
        outbox.emit(slow, "Created", {"n": 1})  # takes seq 1, not committed
        with outbox.transaction() as tx:
            tx.emit("Created", {"n": 2})  # seq 2, committed
        assert watermark() == 0
        with engine.connect() as conn:
            visible = conn.execute(text("SELECT max(seq) FROM outbox_event")).scalar()
        assert visible == 2  # a naive max(seq) reader would skip seq 1 here
        slow_tx.commit()
    assert watermark.settle(10) == 2


@pytest.mark.postgres
def test_postgres_watermark_with_writer_whose_xid_is_older(pg_url: str) -> None:
    """A writer that got its transaction id first but draws its seq later must not let the
    bound pass a seq taken by a younger writer that is still running."""
    from tidings.outbox.schema import ensure_schema
    from tidings.pipeline.source.watermark import SafeWatermark

    engine = make_engine(pg_url)
    ensure_schema(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE account (id text primary key, n int)"))
    outbox = Outbox(engine)
    watermark = SafeWatermark(engine)
    with engine.connect() as older, engine.connect() as younger:
        older_tx = older.begin()
        older.execute(text("INSERT INTO account VALUES ('a', 1)"))  # older gets its xid first
        younger_tx = younger.begin()
        outbox.emit(younger, "Created", {"n": 1}, partition_key="a")  # seq 1, still running
        outbox.emit(older, "Created", {"n": 2}, partition_key="a")  # seq 2
        older_tx.commit()
        for _ in range(5):
            assert watermark() == 0
        younger_tx.commit()
    assert watermark.settle(10) == 2


def test_replay_before_any_relay_batch_touches_nothing(spark, tmp_path: Path) -> None:
    config = relay_config(tmp_path)
    engine = make_engine(config.database.url)
    _emit(Outbox(engine), "Created", "k", 3)
    limits = ReplayLimits.from_config(config)
    limits = ReplayLimits(limits.older_than * 0, 5, limits.time_limit, 100)
    assert run_replay(spark, config, limits=limits).events == 0
    assert set(statuses(engine).values()) == {"PENDING"}  # still the relay's to deliver


def test_log_slices_are_cut_by_size_for_large_payloads(tmp_path: Path) -> None:
    from tidings.pipeline.source.queries import read_slice
    from tidings.pipeline.source.slices import LogSlice

    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    outbox = Outbox(engine)
    big = "x" * 900_000
    with outbox.transaction() as tx:
        for _ in range(100):  # ~90 MB in all, more than one chunk may hold
            tx.emit("Created", {"blob": big})
    chunks = list(read_slice(engine, LogSlice(0, 100, 0, 1)))
    assert len(chunks) >= 2
    seqs = [item.event.seq for chunk in chunks for item in chunk]
    assert seqs == list(range(1, 101))


def test_the_driver_jvm_runs_with_the_configured_java_options(spark) -> None:
    """``relay.driver_java_options`` (default: the JIT's first tier only) reach the JVM."""
    assert TidingsConfig().relay.driver_java_options == "-XX:TieredStopAtLevel=1"
    runtime = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert "-XX:TieredStopAtLevel=1" in list(runtime.getInputArguments())
