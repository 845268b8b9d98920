"""The event log on the real local MariaDB: its schema, its gap-safe watermark, and the relay
reading it while writers commit out of order (PostgreSQL's equivalent is beside it).

The other log tests (producer, confirmations, outcomes, status, events, housekeeping) run on
MariaDB through the ``database_url`` of tests/outbox and tests/pipeline.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import Engine, inspect, select, text

from tests.support.helpers import relay_config, statuses, store_events
from tests.support.producers import OutOfOrderProducers
from tests.support.waiting import wait_until
from tidings.db import make_engine
from tidings.errors import EmitError, SchemaError
from tidings.outbox.producer import Outbox, OutboxTransaction
from tidings.outbox.schema import SCHEMA_VERSION, ensure_schema, meta, outbox_event
from tidings.pipeline.relay_query import start_relay
from tidings.pipeline.replay import ReplayLimits, run_replay
from tidings.pipeline.source.watermark import SafeWatermark

pytestmark = pytest.mark.mysql


def _version(engine: Engine) -> str:
    with engine.connect() as conn:
        return conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).scalar_one()


def test_schema_is_made_with_mysql_types_and_a_binary_collation(mysql_url: str) -> None:
    engine = make_engine(mysql_url)
    ensure_schema(engine)
    assert _version(engine) == str(SCHEMA_VERSION)
    tables = set(inspect(engine).get_table_names())
    assert {"outbox_event", "tidings_target_mark", "tidings_writer", "tidings_lease"} <= tables
    with engine.connect() as conn:
        types = dict(
            conn.execute(
                text(
                    "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN "
                    "('outbox_event', 'tidings_lease')"
                )
            ).all()
        )
        collations = set(
            conn.execute(
                text(
                    "SELECT TABLE_COLLATION FROM information_schema.TABLES "
                    "WHERE TABLE_SCHEMA = DATABASE()"
                )
            ).scalars()
        )
    assert types["payload"] == "longtext" and types["logged_at"] == "datetime(6)"
    assert types["expires_at"] == "double" and types["seq"] == "bigint(20)"
    assert collations == {"utf8mb4_bin"}
    # Keys differing in case only are two keys, as on SQLite and PostgreSQL.
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        tx.emit("Created", {"n": 1}, partition_key="A")
        tx.emit("Created", {"n": 2}, partition_key="a")
    with engine.connect() as conn:
        keys = conn.execute(
            select(outbox_event.c.partition_key).where(outbox_event.c.partition_key == "a")
        ).all()
    assert keys == [("a",)]


def test_schema_upgrades_from_version_1_and_keeps_the_current_version(mysql_url: str) -> None:
    engine = make_engine(mysql_url)
    ensure_schema(engine)
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        tx.emit("Created", {"n": 1})
    # A version-1 log: no target marks.
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE tidings_target_mark"))
        conn.execute(meta.update().values(value="1"))
    ensure_schema(engine)
    assert _version(engine) == str(SCHEMA_VERSION) == "6"
    tables = inspect(engine).get_table_names()
    assert {"tidings_target_mark", "tidings_stream_producer", "tidings_stream_publish"} <= set(
        tables
    )
    ensure_schema(engine)  # the current version: nothing to do, nothing lost
    assert _version(engine) == "6" and statuses(engine) == {1: "PENDING"}
    with engine.begin() as conn:
        conn.execute(meta.update().values(value=str(SCHEMA_VERSION + 1)))
    with pytest.raises(SchemaError, match="newer than this tidings"):
        ensure_schema(engine)


def test_watermark_waits_for_an_in_flight_transaction(mysql_url: str) -> None:
    """The bound never passes a seq held by an uncommitted transaction, though a later seq
    is committed and visible."""
    engine = make_engine(mysql_url)
    outbox = Outbox(engine)
    watermark = SafeWatermark(engine)
    with engine.connect() as slow:
        slow_tx = slow.begin()
        outbox.emit(slow, "Created", {"n": 1})  # seq 1, not committed
        with outbox.transaction() as tx:
            tx.emit("Created", {"n": 2})  # seq 2, committed
        for _ in range(5):
            assert watermark() == 0
        with engine.connect() as conn:
            visible = conn.execute(text("SELECT max(seq) FROM outbox_event")).scalar()
        assert visible == 2  # a naive max(seq) reader would skip seq 1 here
        slow_tx.commit()
    assert watermark.settle(10) == 2


def test_watermark_passes_a_rolled_back_seq_once_the_slot_moves_on(mysql_url: str) -> None:
    """A rolled-back seq leaves a gap the bound passes. A rollback leaves the slot's
    committed claims as they were, so a next transaction of the same connection that holds
    the slot again keeps the bound back too (a wait longer than needed, never a skip)."""
    engine = make_engine(mysql_url)
    outbox = Outbox(engine)
    watermark = SafeWatermark(engine)
    with engine.connect() as conn:
        tx = conn.begin()
        outbox.emit(conn, "Created", {"n": 1})  # seq 1
        assert watermark() == 0
        tx.rollback()
        tx = conn.begin()
        outbox.emit(conn, "Created", {"n": 2})  # seq 2, same slot, probe taken before it
        assert watermark() == 0  # seq 2 is in flight (and the slot looks held since seq 1)
        tx.commit()
    assert watermark.settle(10) == 2
    assert statuses(engine) == {2: "PENDING"}


def test_watermark_waits_for_a_writer_that_took_its_slot_before_others(mysql_url: str) -> None:
    """The mirror of PostgreSQL's older-xid test: a writer that locked its slot first but
    draws its seq after a younger writer that is still running."""
    engine = make_engine(mysql_url)
    outbox = Outbox(engine)
    watermark = SafeWatermark(engine)
    with engine.connect() as older, engine.connect() as younger:
        older_tx = older.begin()
        outbox.emit(older, "Created", {"n": 0}, partition_key="a")  # seq 1
        younger_tx = younger.begin()
        outbox.emit(younger, "Created", {"n": 1}, partition_key="a")  # seq 2, still running
        outbox.emit(older, "Created", {"n": 2}, partition_key="a")  # seq 3
        older_tx.commit()
        for _ in range(5):
            assert watermark() == 0
        younger_tx.commit()
    assert watermark.settle(10) == 3


def test_an_emit_in_autocommit_mode_is_refused(mysql_url: str) -> None:
    """Autocommit would end the slot's lock before the INSERT draws its seq (and could not
    commit the event with a domain write anyway): a clear error, nothing written."""
    engine = make_engine(mysql_url)
    outbox = Outbox(engine)
    with engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(EmitError, match="emit needs a transaction"):
            outbox.emit(auto, "Created", {"n": 1})
    assert statuses(engine) == {}


def _write(tx: OutboxTransaction, rng: random.Random, thread: int) -> list[str]:
    """One to three events of one of 12 keys (keys shared across the threads)."""
    key = f"k{rng.randrange(12)}"
    return [tx.emit("Created", {"t": thread}, partition_key=key) for _ in range(rng.randint(1, 3))]


@pytest.mark.slow
def test_eight_writers_out_of_order_nothing_lost_nothing_rolled_back_key_order(
    spark, tmp_path: Path, mysql_url: str
) -> None:
    """8 producer threads commit out of seq order (a share held for several trigger
    intervals), some roll back, while the relay runs: the store gets every committed event
    once, nothing of a rolled-back transaction, and each key's events in seq order."""
    config = relay_config(tmp_path, mysql_url)
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    producers = OutOfOrderProducers(outbox, _write, threads=8, rollback_share=0.15)
    query = start_relay(spark, config)
    try:
        producers.start()
        time.sleep(8)
        producers.stop()
        wait_until(
            lambda: (
                set(statuses(engine).values()) == {"PUBLISHED"}
                and len(statuses(engine)) == len(producers.committed)
            ),
            timeout=120,
        )
    finally:
        query.stop()
    assert producers.rolled_back and producers.overtaken > 0  # the hard case happened
    stored = store_events(config)
    ids = [e.outbox_event_id for e in stored]
    assert sorted(ids) == sorted(producers.committed)  # every one, once
    assert not set(ids) & set(producers.rolled_back)
    with engine.connect() as conn:
        rows = conn.execute(
            select(outbox_event.c.event_id, outbox_event.c.seq, outbox_event.c.partition_key)
        ).all()
    seq_of = {event_id: seq for event_id, seq, _ in rows}
    key_of = {event_id: key for event_id, _, key in rows}
    by_key: dict[str, list[int]] = defaultdict(list)
    for event_id in ids:
        by_key[key_of[event_id]].append(seq_of[event_id])
    assert all(seqs == sorted(seqs) for seqs in by_key.values())


def test_relay_and_replay_deliver_in_order(spark, tmp_path: Path, mysql_url: str) -> None:
    """The streaming relay publishes a late-committed event after the watermark lets it;
    the replay takes what a failed target left and delivers it in key order."""
    config = relay_config(tmp_path, mysql_url)
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        tx.emit("Created", {"n": 0}, partition_key="warm")
    query = start_relay(spark, config)
    try:
        wait_until(lambda: set(statuses(engine).values()) == {"PUBLISHED"})
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
    # A replay beside it finds nothing left to do, and says so.
    limits = ReplayLimits.from_config(config)
    limits = ReplayLimits(limits.older_than * 0, 5, limits.time_limit, 100)
    done = run_replay(spark, config, limits=limits)
    assert done.events == 0
