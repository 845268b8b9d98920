"""Schema version 4: the (key, status, seq) index a key's parked and unroutable events are
read by, added to a version-3 log on every backend, with nothing lost."""

from __future__ import annotations

from sqlalchemy import inspect, select, text, update

from tidings.db import make_engine
from tidings.events.outbox import EventStatus
from tidings.outbox.incomplete import EventFilter, IncompleteEvents
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import SCHEMA_VERSION, ensure_schema, meta, outbox_event


def test_a_version_3_log_gets_the_key_status_index(database_url: str) -> None:
    engine = make_engine(database_url)
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        for n in range(4):
            tx.emit("Created", {"n": n}, partition_key="a")
        tx.emit("Created", {"n": 9}, partition_key="b")
    with engine.begin() as conn:  # the log as version 3 left it
        on = " ON outbox_event" if engine.dialect.name in ("mysql", "mariadb") else ""
        conn.execute(text(f"DROP INDEX idx_04_outbox_event{on}"))
        conn.execute(update(meta).where(meta.c.key == "schema_version").values(value="3"))
        seqs = conn.execute(select(outbox_event.c.seq).order_by(outbox_event.c.seq)).scalars()
        seqs = list(seqs)
        conn.execute(  # the first and third of key a set aside, the second unroutable
            update(outbox_event)
            .where(outbox_event.c.seq.in_([seqs[0], seqs[2]]))
            .values(status=EventStatus.PARKED.value)
        )
        conn.execute(
            update(outbox_event)
            .where(outbox_event.c.seq == seqs[1])
            .values(status=EventStatus.UNROUTABLE.value)
        )
    assert "idx_04_outbox_event" not in {
        i["name"] for i in inspect(engine).get_indexes("outbox_event")
    }
    ensure_schema(engine)
    with engine.connect() as conn:
        version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
        assert version.scalar_one() == str(SCHEMA_VERSION) == "4"
    indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("outbox_event")}
    assert indexes["idx_04_outbox_event"] == ["partition_key", "status", "seq"]
    ensure_schema(engine)  # the current version: nothing to do
    # A key's events over every status: the open, parked and unroutable reads merged by seq.
    found = IncompleteEvents(engine, lambda _: ()).find(EventFilter(partition_key="a"))
    assert [(e.seq, e.status) for e in found] == [
        (seqs[0], EventStatus.PARKED),
        (seqs[1], EventStatus.UNROUTABLE),
        (seqs[2], EventStatus.PARKED),
        (seqs[3], EventStatus.PENDING),
    ]
    engine.dispose()
