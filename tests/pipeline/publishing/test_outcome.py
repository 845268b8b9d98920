"""Recording outcomes set-based (one UPDATE per distinct outcome, its seqs as one array), on
a real SQLite file and a real PostgreSQL database: every row gets its own group's state,
the guards against stale writes hold, and rows outside the groups are left alone."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from tests.support.publisher_helpers import logged_rows, rows_by_seq
from tidings.db import make_engine
from tidings.events.outbox import EventStatus
from tidings.outbox.confirmations import ConfirmationLog
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import ensure_schema, outbox_event, outbox_event_attribute
from tidings.pipeline.publishing.outcome import CONFIRMED, FAILED, record_outcomes

EVENTS = 1_700  # more than a former chunk of 500 marks per statement, in every group
SECOND, HOUR = timedelta(seconds=1), timedelta(hours=1)


def test_a_batch_of_mixed_outcomes_is_recorded_row_by_row(database_url: str) -> None:
    engine = make_engine(database_url)
    ensure_schema(engine)
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        for n in range(EVENTS):
            tx.emit("A", {"n": n}, partition_key=f"k{n % 7}")
    items = logged_rows(engine)
    published_at = datetime(2026, 11, 26, 15, 0, tzinfo=UTC)
    # seq 1 was parked by an operator and seq 2 published by another run meanwhile.
    with engine.begin() as conn:
        conn.execute(update(outbox_event).where(outbox_event.c.seq == 1).values(status="PARKED"))
        conn.execute(update(outbox_event).where(outbox_event.c.seq == 2).values(status="PUBLISHED"))
    untouched = items.pop()  # not in this run's outcomes
    for n, item in enumerate(items):
        if n % 3 == 0:
            item.deliveries["a"] = {"state": CONFIRMED, "at": "t1"}
            item.published_at = published_at
            item.settle(EventStatus.PUBLISHED)
        elif n % 3 == 1:
            item.deliveries["a"] = {"state": FAILED, "error": "no", "failures": 3}
            item.retry_count = 2
            item.settle(EventStatus.FAILED, json.dumps({"a": "no"}))
        else:
            item.settle(EventStatus.HELD, f"a: held behind unpublished seq {n}")

    record_outcomes(engine, items, delete_published=False)

    rows = rows_by_seq(engine)
    assert rows[1].status == "PUBLISHED"  # delivered: a park is overwritten
    assert rows[2].status == "PUBLISHED"  # a stale failure does not undo another run's work
    for n, item in enumerate(items[2:], start=2):
        row = rows[item.event.seq]
        assert (row.status, row.error_details) == (item.status.value, item.error_details)
        assert json.loads(row.deliveries or "{}") == item.deliveries
        assert row.retry_count == item.retry_count
        assert (row.last_publish_at is not None) == (n % 3 == 0)
        assert row.concurrency_version == 2
    last = rows[untouched.event.seq]
    assert (last.status, last.deliveries, last.concurrency_version) == ("PENDING", None, 1)
    engine.dispose()


def test_delete_on_success_removes_a_large_published_group(database_url: str) -> None:
    engine = make_engine(database_url)
    ensure_schema(engine)
    outbox = Outbox(engine, attribute_extractor=lambda draft: {"n": draft.payload["n"]})
    with outbox.transaction() as tx:
        for n in range(EVENTS):
            tx.emit("A", {"n": n}, partition_key="k")
    items = logged_rows(engine)
    for item in items[:-1]:
        item.settle(EventStatus.PUBLISHED)

    record_outcomes(engine, items, delete_published=True)

    assert list(rows_by_seq(engine)) == [items[-1].event.seq]
    with engine.connect() as conn:  # the attributes went with their events
        kept = conn.execute(select(outbox_event_attribute.c.event_id)).scalars().all()
    assert kept == [items[-1].event.event_id]
    engine.dispose()


def test_recording_raises_each_targets_mark_to_its_newest_confirmation(database_url: str) -> None:
    """The mark the event_server target's re-send counts back from: the newest confirmation
    among the recorded events, per target (deleted ones count too); never lowered by a task
    that records older confirmations later; a stamp that does not parse is left out."""
    engine = make_engine(database_url)
    ensure_schema(engine)
    with Outbox(engine).transaction() as tx:
        for n in range(6):
            tx.emit("A", {"n": n}, partition_key="k")
    items = logged_rows(engine)
    base = datetime(2026, 11, 26, 15, 0, tzinfo=UTC)
    for n, item in enumerate(items[:4]):
        item.deliveries["a"] = {"state": CONFIRMED, "at": (base + n * SECOND).isoformat()}
        item.settle(EventStatus.PUBLISHED)
    items[4].deliveries["a"] = {"state": FAILED, "at": (base + HOUR).isoformat()}
    items[4].deliveries["b"] = {"state": CONFIRMED, "at": "t1"}
    items[4].settle(EventStatus.PENDING, "a: retry")
    record_outcomes(engine, items[:5], delete_published=True)
    log = ConfirmationLog(engine)
    assert (log.mark("a"), log.mark("b")) == (base + 3 * SECOND, None)

    items[5].deliveries["a"] = {"state": CONFIRMED, "at": base.isoformat()}
    items[5].settle(EventStatus.PUBLISHED)
    record_outcomes(engine, items[5:], delete_published=False)
    assert log.mark("a") == base + 3 * SECOND
    engine.dispose()
