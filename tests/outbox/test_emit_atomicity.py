"""Guarantee 1 after a failed emit: the transaction is doomed, whichever way it was opened.

Every test runs the same caller code through the five usual ways of holding a transaction
(tidings' own, a Session with and without ``begin()``, a Connection from ``engine.begin()``
and from ``engine.connect()`` with ``commit()``), on a real SQLite file and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from tidings.db import make_engine
from tidings.errors import EmitError, TransactionDoomed
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event

Execute = Callable[[str], Any]
Emit = Callable[..., str]
Body = Callable[[Execute, Emit], None]
DEPOSIT = "UPDATE account SET balance = balance + 10 WHERE id = 'A1'"


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = make_engine(database_url)
    with eng.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE account (id VARCHAR(8) PRIMARY KEY, balance INT)")
        conn.exec_driver_sql("INSERT INTO account VALUES ('A1', 0)")
    yield eng
    eng.dispose()


def _in_outbox_transaction(engine: Engine, outbox: Outbox, body: Body) -> None:
    with outbox.transaction() as tx:
        body(tx.connection.exec_driver_sql, tx.emit)


def _in_session_begin(engine: Engine, outbox: Outbox, body: Body) -> None:
    with Session(engine) as session, session.begin():
        body(lambda sql: session.execute(text(sql)), partial(outbox.emit, session))


def _in_session_commit(engine: Engine, outbox: Outbox, body: Body) -> None:
    with Session(engine) as session:
        body(lambda sql: session.execute(text(sql)), partial(outbox.emit, session))
        session.commit()


def _in_engine_begin(engine: Engine, outbox: Outbox, body: Body) -> None:
    with engine.begin() as conn:
        body(conn.exec_driver_sql, partial(outbox.emit, conn))


def _in_connection_commit(engine: Engine, outbox: Outbox, body: Body) -> None:
    with engine.connect() as conn:
        body(conn.exec_driver_sql, partial(outbox.emit, conn))
        conn.commit()


WAYS = {
    "outbox.transaction": _in_outbox_transaction,
    "session.begin": _in_session_begin,
    "session.commit": _in_session_commit,
    "engine.begin": _in_engine_begin,
    "connection.commit": _in_connection_commit,
}


@pytest.fixture(params=list(WAYS))
def run(request: pytest.FixtureRequest, engine: Engine) -> Callable[[Body], None]:
    """Run the caller's code in one transaction, opened and committed the chosen way."""
    return partial(WAYS[request.param], engine, Outbox(engine))


def _balance(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT balance FROM account WHERE id = 'A1'").scalar_one()


def _events(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        query = select(outbox_event.c.event_type).order_by(outbox_event.c.seq)
        return list(conn.execute(query).scalars())


def _nothing_written(engine: Engine) -> bool:
    with engine.connect() as conn:
        events = conn.execute(select(func.count()).select_from(outbox_event)).scalar_one()
    return events == 0 and _balance(engine) == 0


def test_the_issue_scenario_commits_nothing_and_raises(
    engine: Engine, run: Callable[[Body], None]
) -> None:
    def body(execute: Execute, emit: Emit) -> None:
        execute(DEPOSIT)
        emit("A", {"n": 1}, partition_key="A1")
        try:  # noqa: SIM105 - the issue's code, as a caller writes it
            emit("B", object())
        except EmitError:
            pass
        emit("C", {"n": 3}, partition_key="A1")

    with pytest.raises(TransactionDoomed, match="not JSON-serialisable") as raised:
        run(body)
    assert "earlier emit in this transaction failed" in str(raised.value)
    assert _nothing_written(engine)


def test_a_caught_emit_error_makes_the_commit_raise(
    engine: Engine, run: Callable[[Body], None]
) -> None:
    def body(execute: Execute, emit: Emit) -> None:
        execute(DEPOSIT)
        emit("A", {"n": 1})
        with pytest.raises(EmitError, match="wildcard") as first:
            emit("*", {})
        assert type(first.value) is EmitError  # the first failure is the plain error

    with pytest.raises(TransactionDoomed, match=r"not committed: an emit in it failed .*wildcard"):
        run(body)
    assert _nothing_written(engine)


def test_a_bad_first_emit_dooms_the_transaction_it_begins(
    engine: Engine, run: Callable[[Body], None]
) -> None:
    """The failure comes before any statement: the statements after it must not commit."""

    def body(execute: Execute, emit: Emit) -> None:
        with pytest.raises(EmitError):
            emit("A", {}, event_id="not-a-uuid")
        execute(DEPOSIT)

    with pytest.raises(TransactionDoomed, match="not a UUID"):
        run(body)
    assert _nothing_written(engine)


def test_an_uncaught_emit_error_rolls_back_and_surfaces_as_itself(
    engine: Engine, run: Callable[[Body], None]
) -> None:
    def body(execute: Execute, emit: Emit) -> None:
        execute(DEPOSIT)
        emit("A", {"n": 1})
        emit("B", {"n": 2}, headers={"bad name": "x"})

    with pytest.raises(EmitError, match="not a token") as raised:
        run(body)
    assert type(raised.value) is EmitError
    assert _nothing_written(engine)


def test_a_caught_duplicate_event_id_dooms_the_transaction(
    engine: Engine, run: Callable[[Body], None]
) -> None:
    """On PostgreSQL the unique violation aborts the transaction: the caller still gets
    tidings' error at commit, not the driver's 'current transaction is aborted'."""
    with Outbox(engine).transaction() as tx:
        taken = tx.emit("Earlier", {})

    def body(execute: Execute, emit: Emit) -> None:
        execute(DEPOSIT)
        with pytest.raises(EmitError, match="already in the event log"):
            emit("A", {}, event_id=taken)

    with pytest.raises(TransactionDoomed, match="already in the event log"):
        run(body)
    assert _balance(engine) == 0 and _events(engine) == ["Earlier"]


def test_a_session_is_usable_again_after_rolling_back_a_doomed_transaction(
    engine: Engine,
) -> None:
    outbox = Outbox(engine)
    with Session(engine) as session:
        session.execute(text(DEPOSIT))
        outbox.emit(session, "A", {})
        with pytest.raises(EmitError):
            outbox.emit(session, "B", float("nan"))
        for _ in range(2):  # stays doomed until rolled back, however often it is retried
            with pytest.raises(TransactionDoomed):
                session.commit()
        session.rollback()
        session.execute(text(DEPOSIT))
        outbox.emit(session, "D", {})
        session.commit()
    assert _balance(engine) == 10 and _events(engine) == ["D"]


def test_a_connection_is_usable_again_after_rolling_back_a_doomed_transaction(
    engine: Engine,
) -> None:
    """The refused commit also ended the database transaction: the next one starts clean."""
    outbox = Outbox(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql(DEPOSIT)
        outbox.emit(conn, "A", {})
        with pytest.raises(EmitError):
            outbox.emit(conn, "B", {}, partition_key="")
        with pytest.raises(TransactionDoomed):
            conn.commit()
        conn.rollback()
        conn.exec_driver_sql(DEPOSIT)
        outbox.emit(conn, "D", {})
        conn.commit()
    assert _balance(engine) == 10 and _events(engine) == ["D"]


def test_excluded_events_of_a_doomed_transaction_are_never_published(engine: Engine) -> None:
    sent: list[str] = []
    outbox = Outbox(
        engine, direct_publisher=lambda events: sent.extend(e.event_type for e in events)
    )
    with pytest.raises(TransactionDoomed), outbox.transaction() as tx:
        tx.emit("Heartbeat", {}, exclude=True)
        with pytest.raises(EmitError):
            tx.emit("B", object())
    with Session(engine) as session:
        outbox.emit(session, "Heartbeat", {}, exclude=True)
        with pytest.raises(EmitError):
            outbox.emit(session, "B", object())
        with pytest.raises(TransactionDoomed):
            session.commit()
        session.rollback()
    assert sent == [] and _nothing_written(engine)
