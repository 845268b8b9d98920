"""Schema versions 4 to 6: the (key, status, seq) index a key's parked and unroutable events
are read by, added to a version-3 log on every backend; on PostgreSQL (version 5) and SQLite
(version 6), it and the correlation index hold only the rows their reads take. Nothing is
lost."""

from __future__ import annotations

from sqlalchemy import Connection, Engine, inspect, select, text, update

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
        # The first and third of key a set aside, the second unroutable.
        _set_status(conn, [seqs[0], seqs[2]], EventStatus.PARKED)
        _set_status(conn, [seqs[1]], EventStatus.UNROUTABLE)
    assert "idx_04_outbox_event" not in {
        i["name"] for i in inspect(engine).get_indexes("outbox_event")
    }
    ensure_schema(engine)
    with engine.connect() as conn:
        version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
        assert version.scalar_one() == str(SCHEMA_VERSION) == "6"
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


def _partial(engine: Engine) -> dict[str, bool]:
    """PostgreSQL and SQLite: which of idx_02 and idx_04 hold only the rows of a condition."""
    if engine.dialect.name == "sqlite":
        statement = (
            "SELECT name, sql LIKE '% WHERE %' FROM sqlite_master "
            "WHERE name IN ('idx_02_outbox_event', 'idx_04_outbox_event')"
        )
    else:
        statement = (
            "SELECT c.relname, i.indpred IS NOT NULL FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname IN ('idx_02_outbox_event', 'idx_04_outbox_event')"
        )
    with engine.connect() as conn:
        return {name: bool(partial) for name, partial in conn.execute(text(statement))}


def test_a_log_with_whole_indexes_gets_the_partial_ones(database_url: str) -> None:
    """Version 5 on PostgreSQL (from version 4) and 6 on SQLite (from version 5): idx_02
    holds only rows with a correlation id and idx_04 only PARKED and UNROUTABLE rows (the
    rows their reads take); MySQL has no partial indexes. A key's set-aside events and a
    lookup by correlation id find the same rows as before."""
    engine = make_engine(database_url)
    dialect = engine.dialect.name
    partial_here = dialect in ("postgresql", "sqlite")
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        for n in range(4):
            tx.emit("Created", {"n": n}, partition_key="a", correlation_id=f"c{n % 2}")
        tx.emit("Created", {"n": 9}, partition_key="a")
    with engine.begin() as conn:
        seqs = list(conn.execute(select(outbox_event.c.seq).order_by(outbox_event.c.seq)).scalars())
        _set_status(conn, [seqs[0], seqs[3]], EventStatus.PARKED)
        _set_status(conn, [seqs[1]], EventStatus.UNROUTABLE)
        _set_status(conn, [seqs[2]], EventStatus.PUBLISHED)
        if partial_here:  # the log as the version before left it: both indexes whole
            for name, columns in (
                ("idx_02_outbox_event", "correlation_id, event_type"),
                ("idx_04_outbox_event", "partition_key, status, seq"),
            ):
                conn.execute(text(f"DROP INDEX {name}"))
                conn.execute(text(f"CREATE INDEX {name} ON outbox_event ({columns})"))
        before = "4" if dialect == "postgresql" else "5"
        conn.execute(update(meta).where(meta.c.key == "schema_version").values(value=before))
    if partial_here:
        assert _partial(engine) == {"idx_02_outbox_event": False, "idx_04_outbox_event": False}
    ensure_schema(engine)
    with engine.connect() as conn:
        version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
        assert version.scalar_one() == str(SCHEMA_VERSION) == "6"
        by_correlation = conn.execute(
            select(outbox_event.c.seq)
            .where(outbox_event.c.correlation_id == "c1", outbox_event.c.event_type == "Created")
            .order_by(outbox_event.c.seq)
        ).scalars()
        assert list(by_correlation) == [seqs[1], seqs[3]]
    if partial_here:
        assert _partial(engine) == {"idx_02_outbox_event": True, "idx_04_outbox_event": True}
    indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("outbox_event")}
    assert indexes["idx_02_outbox_event"] == ["correlation_id", "event_type"]
    assert indexes["idx_04_outbox_event"] == ["partition_key", "status", "seq"]
    events = IncompleteEvents(engine, lambda _: ())
    for _ in range(7):  # past psycopg's prepare threshold: a prepared read finds them too
        found = events.find(EventFilter(partition_key="a"))
        assert [(e.seq, e.status) for e in found] == [
            (seqs[0], EventStatus.PARKED),
            (seqs[1], EventStatus.UNROUTABLE),
            (seqs[3], EventStatus.PARKED),
            (seqs[4], EventStatus.PENDING),
        ]
    parked = events.find(EventFilter(partition_key="a", statuses=frozenset({EventStatus.PARKED})))
    assert [e.seq for e in parked] == [seqs[0], seqs[3]]
    if dialect == "sqlite":  # the planner matches the read's condition to the partial index
        [query] = events._queries(EventFilter(partition_key="a"), frozenset({EventStatus.PARKED}))
        compiled = query.compile(engine, compile_kwargs={"literal_binds": True})
        with engine.connect() as conn:
            plan = " ".join(
                row[-1] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}")
            )
        assert "USING INDEX idx_04_outbox_event (partition_key=? AND status=?)" in plan, plan
    ensure_schema(engine)  # the current version: nothing to do
    engine.dispose()


def _set_status(conn: Connection, seqs: list[int], status: EventStatus) -> None:
    """Set the rows ``seqs`` to ``status`` by hand, as an operator's or a relay's run left them."""
    conn.execute(
        update(outbox_event).where(outbox_event.c.seq.in_(seqs)).values(status=status.value)
    )
