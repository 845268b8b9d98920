"""What the outbox log records of the ``rabbitmq_stream`` target's producers, on SQLite,
PostgreSQL and MariaDB: slots taken by one holder at a time (free again once released or
expired, never while held), the publishing ids written with a lease renewal and refused
without it, reconciliation dropping what the broker did not store, and the assignments of
published events forgotten; a version 2 log gets the tables."""

from __future__ import annotations

import time

from sqlalchemy import Engine, inspect, select, text, update

from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import SCHEMA_VERSION, ensure_schema, meta, outbox_event
from tidings.outbox.stream_ids import Assignment, StreamIds, reference


def _log(database_url: str) -> tuple[Engine, StreamIds]:
    engine = make_engine(database_url)
    ensure_schema(engine)
    return engine, StreamIds(engine, "orders-rs")


def test_a_slot_is_one_holders_until_released_or_expired(database_url: str) -> None:
    engine, ids = _log(database_url)
    assert ids.take("s", "a", 60, pool=2) == 0
    assert ids.take("s", "b", 60, pool=2) == 1
    waiting = ids.take("s", "c", 60, pool=2)  # both held: seconds until one expires
    assert isinstance(waiting, float) and 50 < waiting <= 60.01
    assert isinstance(ids.take("t", "c", 60, pool=2), int)  # another stream: its own pool
    ids.release("s", 0, "a")
    assert ids.take("s", "c", 60, pool=2) == 0
    ids.release("s", 1, "not-b")  # only the holder gives a slot back
    assert isinstance(ids.take("s", "d", 60, pool=2, slot=1), float)
    ids.abandon("s", 1, "b", 0.05)  # in flight, perhaps: cools down first
    assert isinstance(ids.take("s", "d", 60, pool=2, slot=1), float)
    time.sleep(0.1)
    assert ids.take("s", "d", 60, pool=2, slot=1) == 1
    assert reference("orders-rs", 1) == "orders-rs.producer-1"
    engine.dispose()


def test_ids_are_recorded_only_with_the_lease_and_replace_older_ones(database_url: str) -> None:
    engine, ids = _log(database_url)
    slot = ids.take("s", "a", 60, pool=1)
    assert slot == 0
    assert ids.assign("s", 0, "a", 60, [("e1", 1), ("e2", 2)])
    assert not ids.assign("s", 0, "intruder", 60, [("e3", 3)])
    assert ids.assignments(["e1", "e2", "e3"]) == {
        "e1": Assignment("s", 0, 1),
        "e2": Assignment("s", 0, 2),
    }
    assert ids.assign("s", 0, "a", 60, [("e1", 3)])  # sent again, under a new id
    assert ids.assignments(["e1"]) == {"e1": Assignment("s", 0, 3)}
    ids.forget(["e2"])
    assert ids.assignments(["e2"]) == {}
    engine.dispose()


def test_reconciling_drops_what_the_broker_did_not_store(database_url: str) -> None:
    engine, ids = _log(database_url)
    ids.take("s", "a", 60, pool=2)
    ids.take("s", "b", 60, pool=2)
    assert ids.assign("s", 0, "a", 60, [(f"e{n}", n) for n in range(1, 6)])
    assert ids.assign("s", 1, "b", 60, [("f1", 1)])
    ids.reconcile("s", 0, 3)  # the broker stored up to 3 under slot 0
    found = ids.assignments([*(f"e{n}" for n in range(1, 6)), "f1"])
    assert sorted(found) == ["e1", "e2", "e3", "f1"]
    engine.dispose()


def test_the_assignments_of_published_or_deleted_events_are_forgotten(database_url: str) -> None:
    engine, ids = _log(database_url)
    with Outbox(engine).transaction() as tx:
        event_ids = [tx.emit("Created", {"n": n}) for n in range(3)]
    ids.take("s", "a", 60, pool=1)
    assert ids.assign("s", 0, "a", 60, [(e, n + 1) for n, e in enumerate([*event_ids, "gone"])])
    with engine.begin() as conn:
        conn.execute(
            update(outbox_event)
            .where(outbox_event.c.event_id == event_ids[0])
            .values(status="PUBLISHED")
        )
    assert ids.forget_published() == 2
    assert sorted(ids.assignments([*event_ids, "gone"])) == sorted(event_ids[1:])
    engine.dispose()


def test_a_version_2_log_gets_the_stream_tables(database_url: str) -> None:
    engine = make_engine(database_url)
    ensure_schema(engine)
    with engine.begin() as conn:  # the log as version 2 left it
        conn.execute(text("DROP TABLE tidings_stream_publish"))
        conn.execute(text("DROP TABLE tidings_stream_producer"))
        conn.execute(update(meta).where(meta.c.key == "schema_version").values(value="2"))
    ensure_schema(engine)
    with engine.connect() as conn:
        version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
        assert version.scalar_one() == str(SCHEMA_VERSION) == "6"
    tables = set(inspect(engine).get_table_names())
    assert {"tidings_stream_producer", "tidings_stream_publish"} <= tables
    ids = StreamIds(engine, "t")
    assert ids.take("s", "a", 60, pool=1) == 0
    engine.dispose()
