"""The producer: a domain write and its events commit together or not at all."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, func, select
from sqlalchemy.orm import Session

from tidings.config import OutboxConfig
from tidings.db import make_engine
from tidings.errors import EmitError, TransactionDoomed
from tidings.outbox.checks import MAX_HEADER_NAME_BYTES, MAX_HEADER_VALUE_BYTES, MAX_HEADERS_BYTES
from tidings.outbox.envelope import identity
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event, outbox_event_attribute

domain = MetaData()
account = Table(
    "account", domain, Column("id", String(64), primary_key=True), Column("balance", Integer)
)


def _count(engine: Engine, table: Table) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


@pytest.fixture
def engine(database_url: str) -> Engine:
    eng = make_engine(database_url)
    domain.create_all(eng)
    return eng


def test_transaction_form_commits_both(engine: Engine) -> None:
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        tx.connection.execute(account.insert().values(id="a", balance=5))
        event_id = tx.emit("AccountOpened", {"id": "a"}, partition_key="a", headers={"h": "v"})
    with engine.connect() as conn:
        row = conn.execute(select(outbox_event).where(outbox_event.c.event_id == event_id)).one()
    assert row.status == "PENDING" and row.partition_key == "a"
    assert json.loads(row.headers) == {"h": "v"}
    envelope = json.loads(row.payload)
    assert envelope["specversion"] == "1.0" and envelope["data"] == {"id": "a"}
    assert envelope["id"] == event_id and envelope["type"] == "AccountOpened"
    assert _count(engine, account) == 1


def test_drawn_event_and_attribute_ids_are_time_ordered_uuids(engine: Engine) -> None:
    """Ids the outbox draws sort in the order they were drawn (across milliseconds), so the
    unique indexes on them grow at their end; an id the caller names is kept as given."""
    outbox = Outbox(engine, attribute_extractor=lambda draft: {"n": str(draft.payload["n"])})
    drawn = []
    for n in range(3):
        with outbox.transaction() as tx:
            drawn.append(tx.emit("Ticked", {"n": n}))
        time.sleep(0.002)
    named = str(uuid.uuid4())
    with outbox.transaction() as tx:
        tx.emit("Ticked", {"n": 3}, event_id=named)

    assert drawn == sorted(drawn) and all(uuid.UUID(i).version == 7 for i in drawn)
    with engine.connect() as conn:
        attributes = conn.execute(
            select(outbox_event_attribute.c.attribute_id, outbox_event_attribute.c.event_id)
        ).all()
        stored = conn.execute(select(outbox_event.c.event_id).order_by(outbox_event.c.seq))
        assert [row.event_id for row in stored] == [*drawn, named]
    by_event = {event_id: attribute_id for attribute_id, event_id in attributes}
    attribute_ids = [by_event[i] for i in drawn]
    assert attribute_ids == sorted(attribute_ids)
    assert all(uuid.UUID(i).version == 7 for i in attribute_ids)


def test_exception_mid_transaction_commits_neither(engine: Engine) -> None:
    outbox = Outbox(engine)
    with pytest.raises(RuntimeError), outbox.transaction() as tx:
        tx.connection.execute(account.insert().values(id="a", balance=5))
        tx.emit("AccountOpened", {"id": "a"})
        raise RuntimeError("domain logic failed")
    assert _count(engine, account) == 0 and _count(engine, outbox_event) == 0


def test_session_rollback_drops_the_event(engine: Engine) -> None:
    outbox = Outbox(engine)
    with Session(engine) as session:
        session.execute(account.insert().values(id="a", balance=1))
        outbox.emit(session, "AccountOpened", {"id": "a"})
        session.rollback()
    assert _count(engine, account) == 0 and _count(engine, outbox_event) == 0
    with Session(engine) as session, session.begin():
        session.execute(account.insert().values(id="b", balance=1))
        outbox.emit(session, "AccountOpened", {"id": "b"})
    assert _count(engine, account) == 1 and _count(engine, outbox_event) == 1


def test_connection_form(engine: Engine) -> None:
    outbox = Outbox(engine)
    with engine.begin() as conn:
        conn.execute(account.insert().values(id="a", balance=1))
        outbox.emit(conn, "AccountOpened", {"id": "a"})
    with pytest.raises(ZeroDivisionError), engine.begin() as conn:
        conn.execute(account.insert().values(id="b", balance=1))
        outbox.emit(conn, "AccountOpened", {"id": "b"})
        _ = 1 / 0
    assert _count(engine, account) == 1 and _count(engine, outbox_event) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"event_type": None, "payload": {}}, "event type is required"),
        ({"event_type": "", "payload": {}}, "non-empty string"),
        ({"event_type": "X", "payload": {"when": object()}}, "not JSON-serialisable"),
        ({"event_type": "X", "payload": float("nan")}, "not JSON-serialisable"),
        ({"event_type": "X", "payload": "x" * 2000}, "over the limit of 1024 bytes"),
        ({"event_type": "X", "payload": {}, "event_id": "nope"}, "not a UUID"),
        ({"event_type": "X", "payload": {}, "headers": {"a": 1}}, "pair of strings"),
        ({"event_type": "X", "payload": {}, "headers": {"tenant id": "eu"}}, "not a token"),
        ({"event_type": "X", "payload": {}, "headers": {"h": "a\r\nb"}}, "line break"),
        ({"event_type": "X\x00", "payload": {}}, "NUL character"),
        ({"event_type": "X", "payload": {}, "partition_key": "\ud800"}, "unpaired surrogate"),
        ({"event_type": "X", "payload": {"s": "\ud800"}}, "not valid UTF-8"),
        ({"event_type": "*", "payload": {}}, "wildcard"),
        ({"event_type": "orders.*", "payload": {}}, "the wildcard of route patterns"),
        (
            {"event_type": "X", "payload": {}, "headers": {"h" * (MAX_HEADER_NAME_BYTES + 1): ""}},
            f"is {MAX_HEADER_NAME_BYTES + 1} bytes, over the limit of {MAX_HEADER_NAME_BYTES}",
        ),
        (  # counted in UTF-8 bytes, not characters
            {"event_type": "X", "payload": {}, "headers": {"h": "é" * MAX_HEADER_VALUE_BYTES}},
            f"'h' value is {2 * MAX_HEADER_VALUE_BYTES} bytes, over the limit of "
            f"{MAX_HEADER_VALUE_BYTES}",
        ),
        (
            {
                "event_type": "X",
                "payload": {},
                "headers": {f"h{i}": "v" * MAX_HEADER_VALUE_BYTES for i in range(2)},
            },
            f"headers are {2 * (MAX_HEADER_VALUE_BYTES + 2)} bytes .*over the limit of "
            f"{MAX_HEADERS_BYTES}",
        ),
    ],
)
def test_bad_emit_raises_and_nothing_commits(engine: Engine, kwargs: dict, message: str) -> None:
    outbox = Outbox(engine, OutboxConfig(max_payload_bytes=1024))
    with Session(engine) as session:
        session.execute(account.insert().values(id="a", balance=1))
        with pytest.raises(EmitError, match=message):
            outbox.emit(session, **kwargs)
        with pytest.raises(TransactionDoomed, match=message):
            session.commit()  # the caller tries to commit anyway: the emit doomed it
    assert _count(engine, account) == 0 and _count(engine, outbox_event) == 0


def test_headers_at_their_bounds_are_accepted(engine: Engine) -> None:
    names = [f"h{i}".ljust(MAX_HEADER_NAME_BYTES, "x") for i in range(2)]
    headers = {names[0]: "v" * MAX_HEADER_VALUE_BYTES}
    headers[names[1]] = "v" * (MAX_HEADERS_BYTES - sum(map(len, names)) - MAX_HEADER_VALUE_BYTES)
    with Outbox(engine).transaction() as tx:
        event_id = tx.emit("X", {}, headers=headers)
    with engine.connect() as conn:
        stored = conn.execute(
            select(outbox_event.c.headers).where(outbox_event.c.event_id == event_id)
        ).scalar_one()
    assert json.loads(stored) == headers


def test_attribute_extractor_and_transformer(engine: Engine) -> None:
    outbox = Outbox(
        engine,
        transformer=identity,
        attribute_extractor=lambda d: {"account": d.payload["id"], "region": None},
    )
    with outbox.transaction() as tx:
        event_id = tx.emit("AccountOpened", {"id": "a"})
    with engine.connect() as conn:
        payload = conn.execute(select(outbox_event.c.payload)).scalar_one()
        attrs = dict(
            conn.execute(
                select(
                    outbox_event_attribute.c.attribute_key, outbox_event_attribute.c.attribute_value
                ).where(outbox_event_attribute.c.event_id == event_id)
            ).all()
        )
    assert json.loads(payload) == {"id": "a"}
    assert attrs == {"account": "a", "region": None}


def test_excluded_events_skip_the_log_and_go_out_after_commit(engine: Engine) -> None:
    sent: list[str] = []
    outbox = Outbox(
        engine,
        exclude=lambda d: d.event_type == "Heartbeat",
        direct_publisher=lambda events: sent.extend(e.event_type for e in events),
    )
    with outbox.transaction() as tx:
        tx.emit("Heartbeat", {})
        tx.emit("Ping", {}, exclude=True)
        tx.emit("AccountOpened", {"id": "a"})
        assert sent == []  # nothing goes out before the commit
    assert sent == ["Heartbeat", "Ping"]
    assert _count(engine, outbox_event) == 1
    with Session(engine) as session:
        outbox.emit(session, "Heartbeat", {})
        session.rollback()
        outbox.emit(session, "Heartbeat", {"n": 2})
        session.commit()
    assert sent == ["Heartbeat", "Ping", "Heartbeat"]  # the rolled-back one never went out
    with pytest.raises(EmitError, match="bare Connection"), engine.begin() as conn:
        outbox.emit(conn, "Heartbeat", {})


def test_schema_version_newer_than_library_is_refused(tmp_path: Path) -> None:
    from sqlalchemy import update

    from tidings.errors import SchemaError
    from tidings.outbox.schema import ensure_schema, meta

    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    ensure_schema(engine)
    ensure_schema(engine)  # idempotent
    with engine.begin() as conn:
        conn.execute(update(meta).values(value="99"))
    with pytest.raises(SchemaError, match="newer"):
        ensure_schema(engine)


def test_from_config_sends_excluded_events_to_their_routed_targets(tmp_path: Path) -> None:
    from tests.support.helpers import relay_config
    from tidings.server.store import EventStore
    from tidings.targets.routed import outbox_from_config

    config = relay_config(tmp_path, routes={"Heartbeat": ["store"]})
    outbox = outbox_from_config(config, exclude=lambda d: d.event_type == "Heartbeat")
    with outbox.transaction() as tx:
        tx.emit("Heartbeat", {"alive": True})
        tx.emit("Unrouted", {}, exclude=True)  # excluded and unrouted: goes nowhere
    assert _count(outbox.engine, outbox_event) == 0
    store = EventStore(config.targets["store"].url)
    try:
        assert [e.type for e in store.read()] == [("t", "Heartbeat")]
    finally:
        store.close()
    with (
        pytest.raises(EmitError, match="no direct publisher"),
        Outbox(outbox.engine).transaction() as tx,
    ):
        tx.emit("Heartbeat", {}, exclude=True)


def test_duplicate_event_id_is_an_emit_error(engine: Engine) -> None:
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        event_id = tx.emit("X", {})
    with Session(engine) as session:
        session.execute(account.insert().values(id="a", balance=1))
        with pytest.raises(EmitError, match="already in the event log"):
            outbox.emit(session, "X", {}, event_id=event_id)
        session.rollback()
    assert _count(engine, account) == 0 and _count(engine, outbox_event) == 1


def test_a_failing_direct_publisher_does_not_fail_the_committed_transaction(
    engine: Engine,
) -> None:
    def broken(events: object) -> None:
        raise RuntimeError("broker down")

    outbox = Outbox(engine, direct_publisher=broken)
    with outbox.transaction() as tx:
        tx.connection.execute(account.insert().values(id="a", balance=1))
        tx.emit("Heartbeat", {}, exclude=True)
    assert _count(engine, account) == 1
