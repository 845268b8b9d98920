"""A standby relay prepares its takeover while it waits: its relay query built, and a warm-up
query running on the relay's code paths. The warm-up publishes nothing, writes no status, no
batch log, nothing into the relay's checkpoint and takes no lease; once the standby holds the
lease, the query it prepared publishes. A preparation that fails leaves a cold start. Real
local SparkSession, real SQLite files."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from sqlalchemy import select

from tests.support.helpers import relay_config, statuses, store_events
from tests.support.waiting import wait_until
from tidings.config.relay import RelayLeaseConfig
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import batch_log, ensure_schema
from tidings.pipeline import warmup
from tidings.pipeline.relay_query import QUERY_NAME, start_writer
from tidings.pipeline.standby import RelayLease
from tidings.pipeline.warmup import WarmStandby

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _warm_up_query(spark):
    return next((q for q in spark.streams.active if q.name == f"{QUERY_NAME}-warm-up"), None)


def test_a_standby_warms_up_publishing_nothing_then_starts_its_prepared_query(
    spark, tmp_path: Path
) -> None:
    config = relay_config(tmp_path)
    engine = make_engine(config.database.url)
    ensure_schema(engine)
    with Outbox(engine).transaction() as tx:
        for n in range(5):
            tx.emit("Created", {"n": n}, partition_key="k")
    # Long enough for the test's whole run: nothing renews it here.
    lease = RelayLease(engine, RelayLeaseConfig(ttl="10m", renew_every="1s"))
    standby = WarmStandby(spark, config, None, lease.owner)
    try:
        standby.prepare()
        assert standby.prepared()
        warm = _warm_up_query(spark)
        assert warm is not None
        wait_until(lambda: warm.lastProgress is not None, 120)
        assert warm.lastProgress["numInputRows"] == 1  # its task ran: one (empty) summary

        assert set(statuses(engine).values()) == {"PENDING"}
        with engine.connect() as conn:
            assert conn.execute(select(batch_log.c.id)).all() == []
        assert store_events(config) == []
        assert not (tmp_path / "checkpoint").exists()
        assert lease.holder() is None

        assert lease.acquire(threading.Event())
        writer = standby.take()
        assert writer is not None and not standby.prepared()
        query = start_writer(writer, config)
        standby.close()  # as the relay does: the warm-up stops while the query starts
        assert _warm_up_query(spark) is None
        try:
            wait_until(lambda: set(statuses(engine).values()) == {"PUBLISHED"}, 120)
        finally:
            query.stop()
    finally:
        standby.close()
        lease.release()
    assert [e.outbox_event_id is not None for e in store_events(config)] == [True] * 5


def test_a_standby_that_cannot_prepare_says_so_and_starts_cold(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The warm-up query failing to start is injected (a real part cannot be made to fail
    there on purpose): the standby logs it and has nothing prepared, so it starts cold."""

    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected: no warm-up")

    monkeypatch.setattr(warmup, "warm_up_writer", fails)
    config = relay_config(tmp_path)
    standby = WarmStandby(spark, config, None, "owner")
    with caplog.at_level(logging.WARNING, logger="tidings.pipeline.warmup"):
        standby.prepare()
        assert not standby.prepared()
    assert "preparing the takeover failed; it will start cold" in caplog.text
    assert standby.take() is None
    assert _warm_up_query(spark) is None
