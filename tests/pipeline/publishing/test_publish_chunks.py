"""A task publishes its slice of the log chunk by chunk (bounded runs of the publisher); a
key's order holds across chunks because each run looks up, in one statement, the open
events before each of its keys' first event (:func:`open_rows_before`). Real SQLite files
and a real PostgreSQL database; ``Refusing`` injects the poison (see publisher_helpers)."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select, update

from tests.support.publisher_helpers import Refusing, emit_all, local_store, rows_by_seq
from tidings.db import make_engine
from tidings.events.outbox import EventStatus
from tidings.events.timeutil import as_utc
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import (
    OUTBOX_EVENT_COLUMNS,
    ensure_schema,
    outbox_event,
    outbox_event_from_row,
)
from tidings.pipeline.publishing.publisher import Publisher, open_rows_before
from tidings.pipeline.source.queries import read_slice
from tidings.pipeline.source.slices import LogSlice
from tidings.routing.table import merge_routes
from tidings.server.store import EventStore


def test_a_key_held_in_one_chunk_stays_held_in_the_next(database_url: str, tmp_path: Path) -> None:
    engine = make_engine(database_url)
    ensure_schema(engine)
    emit_all(
        engine,
        [
            ("A", "k", {"n": "poison"}),
            ("A", "j", {"n": 2}),
            ("A", "k", {"n": 3}),
            ("A", "j", {"n": 4}),
            ("A", "k", {"n": 5}),
            ("A", None, {"n": 6}),
            ("A", "i", {"n": 7}),
        ],
    )
    target = Refusing("a", local_store(tmp_path, "a"), "poison")
    chunks = list(read_slice(engine, LogSlice(0, 7, 0, 1), chunk=2))
    assert [[i.event.seq for i in chunk] for chunk in chunks] == [[1, 2], [3, 4], [5, 6], [7]]

    for chunk in chunks:
        Publisher(engine, merge_routes({"A": ["a"]}), {"a": target}.get, [0.0]).run(chunk)

    rows = rows_by_seq(engine)
    assert {s: r.status for s, r in rows.items()} == {
        1: "FAILED",
        2: "PUBLISHED",
        3: "HELD",
        4: "PUBLISHED",
        5: "HELD",
        6: "PUBLISHED",
        7: "PUBLISHED",
    }
    assert "seq 1" in rows[3].error_details and "seq 1" in rows[5].error_details
    store = EventStore(f"sqlite:///{tmp_path / 'a.db'}")
    by_id = {r.event_id: seq for seq, r in rows.items()}
    assert [by_id[e.outbox_event_id] for e in store.read(0, 100)] == [2, 4, 6, 7]
    store.close()
    engine.dispose()


def test_open_rows_before_finds_only_open_earlier_rows_of_each_key(database_url: str) -> None:
    engine = make_engine(database_url)
    ensure_schema(engine)
    emit_all(engine, [("A", key, {"n": n}) for n, key in enumerate("kjkjkxk", start=1)])
    with engine.begin() as conn:  # seq 1 (k) was published, seq 4 (j) parked
        conn.execute(update(outbox_event).where(outbox_event.c.seq == 1).values(status="PUBLISHED"))
        conn.execute(update(outbox_event).where(outbox_event.c.seq == 4).values(status="PARKED"))

    found = open_rows_before(engine, {"k": 7, "j": 4, "x": 6, "nobody": 99})

    assert sorted((key, seq) for key, seq, _type, _deliveries in found) == [
        ("j", 2),
        ("k", 3),
        ("k", 5),
    ]
    assert open_rows_before(engine, {}) == []
    engine.dispose()


def test_a_slice_reads_each_row_as_the_log_holds_it(database_url: str) -> None:
    """A task's events are the rows as SQLAlchemy reads them (on SQLite they come straight
    from the driver's cursor, the time as its text): every field of the event, its times
    in UTC, and the row's publication state."""
    engine = make_engine(database_url)
    ensure_schema(engine)
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        tx.emit("A", {"n": 1}, partition_key="k", correlation_id="c1", headers={"h": "v"})
        tx.emit("B", {"n": 2}, version="2")
        tx.emit("A", {"n": 3}, partition_key="k")
    states = {"a": {"state": "failed", "error": "no", "failures": 2, "retry_at": 1.5}}
    with engine.begin() as conn:
        conn.execute(
            update(outbox_event)
            .where(outbox_event.c.seq == 2)
            .values(status="FAILED", retry_count=2, deliveries=json.dumps(states))
        )
    [chunk] = list(read_slice(engine, LogSlice(0, 3, 0, 1)))
    with engine.connect() as conn:
        rows = {row.seq: row for row in conn.execute(select(outbox_event))}
    assert [item.event.seq for item in chunk] == [1, 2, 3]
    for item in chunk:
        row = rows[item.event.seq]
        assert item.event == outbox_event_from_row(
            *(getattr(row, name) for name in OUTBOX_EVENT_COLUMNS)
        )
        assert item.event.logged_at == as_utc(row.logged_at)
        assert item.event.logged_at.utcoffset() is not None
    assert chunk[0].event.headers == {"h": "v"} and chunk[0].event.correlation_id == "c1"
    assert chunk[1].event.version == "2" and chunk[1].event.partition_key is None
    assert [(i.status, i.retry_count, i.deliveries) for i in chunk] == [
        (EventStatus.PENDING, 0, {}),
        (EventStatus.FAILED, 2, states),
        (EventStatus.PENDING, 0, {}),
    ]
    engine.dispose()
