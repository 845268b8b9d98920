"""What the event log says about the confirmations at a target (what the ``event_server``
target sends again after a move), on a real SQLite file and a real PostgreSQL database: the
events confirmed there within the window back from the target's mark, in log order and
within the bounds; marks that only rise; reads through indexes; a version 1 log upgraded."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, inspect, select, text, update

from tests.support.query_plans import reads, sqlite_plans
from tidings.db import make_engine
from tidings.events.timeutil import as_utc, utcnow
from tidings.outbox.confirmations import ConfirmationLog, raise_marks
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import SCHEMA_VERSION, ensure_schema, meta, outbox_event, target_mark

SECOND = timedelta(seconds=1)
#: The last confirmation at ``pair`` was made an hour ago: the relay that takes over now
#: still finds the events of the seconds before it.
MARK = utcnow() - timedelta(hours=1)


def _emit(engine: Engine, count: int) -> None:
    with Outbox(engine).transaction() as tx:
        for n in range(count):
            tx.emit("Created", {"n": n}, partition_key=f"k{n % 3}")


def _set(engine: Engine, seq: int, deliveries: dict, updated_at: datetime, status: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(outbox_event)
            .where(outbox_event.c.seq == seq)
            .values(deliveries=json.dumps(deliveries), updated_at=updated_at, status=status)
        )


def _confirmed(at: datetime) -> dict:
    return {"state": "confirmed", "at": at.isoformat()}


def _build_log(engine: Engine) -> None:
    """Rows 1-8 as the relay leaves them; the marks: ``pair`` at MARK, ``other`` 2 s before.

    In ``pair``'s window (10 s before MARK): 2, 5 (changed later for ``other``) and 6."""
    _emit(engine, 8)
    _set(engine, 1, {"pair": _confirmed(MARK - 60 * SECOND)}, MARK - 60 * SECOND, "PUBLISHED")
    _set(engine, 2, {"pair": _confirmed(MARK - 5 * SECOND)}, MARK - 5 * SECOND, "PUBLISHED")
    _set(engine, 3, {"other": _confirmed(MARK - 2 * SECOND)}, MARK - 2 * SECOND, "PUBLISHED")
    failed = {"pair": {"state": "failed", "error": "no", "at": (MARK - SECOND).isoformat()}}
    _set(engine, 4, failed, MARK - SECOND, "PENDING")
    waits = {"pair": _confirmed(MARK - 8 * SECOND), "other": {"state": "failed", "error": "x"}}
    _set(engine, 5, waits, MARK, "HELD")
    _set(engine, 6, {"pair": _confirmed(MARK)}, MARK, "PUBLISHED")
    # 7 is fresh (PENDING, no deliveries); 8 was confirmed at pair long before, published later.
    _set(engine, 8, {"pair": _confirmed(MARK - 70 * SECOND)}, MARK - SECOND, "PUBLISHED")
    with engine.begin() as conn:
        raise_marks(conn, {"pair": MARK, "other": MARK - 2 * SECOND})


def _seqs(log: ConfirmationLog, target: str, *bounds: float) -> list[int]:
    return [event.seq for event in log.recent(target, *bounds)]


def test_the_events_confirmed_within_the_window_before_the_mark(database_url: str) -> None:
    engine = make_engine(database_url)
    ensure_schema(engine)
    _build_log(engine)
    log = ConfirmationLog(engine)
    assert log.mark("pair") == MARK
    events = log.recent("pair", 10, 100, 2**20)
    assert [event.seq for event in events] == [2, 5, 6]
    assert [json.loads(event.payload)["data"]["n"] for event in events] == [1, 4, 5]
    assert [event.partition_key for event in events] == ["k1", "k1", "k2"]
    assert _seqs(log, "pair", 61, 100, 2**20) == [1, 2, 5, 6]
    assert _seqs(log, "other", 10, 100, 2**20) == [3]
    assert _seqs(log, "pair", 0, 100, 2**20) == []
    # A target with no mark yet: the window ends now, and nothing was confirmed there.
    assert (log.mark("nobody"), _seqs(log, "nobody", 10, 100, 2**20)) == (None, [])
    engine.dispose()


def test_past_its_bounds_the_newest_events_stay(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    _build_log(engine)
    log = ConfirmationLog(engine)
    assert _seqs(log, "pair", 10, 2, 2**20) == [5, 6]
    one = len(log.recent("pair", 10, 1, 2**20)[0].payload) + 200
    assert _seqs(log, "pair", 10, 100, one) == [6]  # the newest alone passes the bytes: sent
    assert _seqs(log, "pair", 10, 100, 1) == [6]


def test_a_mark_only_rises(database_url: str) -> None:
    engine = make_engine(database_url)
    ensure_schema(engine)
    log = ConfirmationLog(engine)
    with engine.begin() as conn:
        raise_marks(conn, {"a": MARK, "b": MARK})
    with engine.begin() as conn:  # a task that records late: an older confirmation
        raise_marks(conn, {"a": MARK - 30 * SECOND, "b": MARK + SECOND})
    assert (log.mark("a"), log.mark("b")) == (MARK, MARK + SECOND)
    engine.dispose()


def test_the_log_is_read_through_indexes(tmp_path: Path) -> None:
    """The rows are found through the (status, updated_at) index and fetched by seq, the
    mark by its key: no SELECT scans a table (the read must stay cheap on a 10M-row log).
    Each row's own deliveries are a virtual table (json_each) walked per row found."""
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    _build_log(engine)
    log = ConfirmationLog(engine)
    plans = sqlite_plans(engine, lambda: log.recent("pair", 10, 100, 2**20))
    assert len(plans) == 3
    for statement, plan in plans:
        tables = [step for step in reads(plan) if "VIRTUAL TABLE" not in step]
        assert tables and all(step.startswith("SEARCH") for step in tables), (statement, plan)
    assert "idx_01_outbox_event" in " ".join(plans[1][1])


def test_a_version_1_log_gets_the_marks(database_url: str) -> None:
    engine = make_engine(database_url)
    ensure_schema(engine)
    with engine.begin() as conn:  # the log as version 1 left it
        conn.execute(text("DROP TABLE tidings_target_mark"))
        conn.execute(update(meta).where(meta.c.key == "schema_version").values(value="1"))
    assert not inspect(engine).has_table("tidings_target_mark")
    ensure_schema(engine)
    with engine.begin() as conn:
        version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
        assert version.scalar_one() == str(SCHEMA_VERSION) == "6"
        raise_marks(conn, {"a": MARK})
        stored = conn.execute(select(target_mark.c.confirmed_at)).scalar_one()
    assert as_utc(stored) == MARK
    engine.dispose()
