"""The relay publishing into the embedded event store (the event_store target) through an
engine: every call is one session, run through the target's modules, on real SQLite and
PostgreSQL stores, and through the real relay on Spark.

The module is :mod:`tests.support.witness_module`: it adds a witness event for every event
it is offered, so the store shows what it saw, from whichever process it ran in.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.harness.processes import ServerProcess, free_port
from tests.support.helpers import relay_config, store_events, store_target
from tests.support.waiting import run
from tests.support.witness_module import witness_config
from tidings.client import connect
from tidings.config import load_config
from tidings.db import make_engine
from tidings.errors import ConfigError, TargetCallFailed, TargetUnavailable
from tidings.events.model import StoredEvent
from tidings.events.outbox import OutboxEvent
from tidings.events.sources import RELAY_SOURCE, SourceKind
from tidings.outbox.producer import Outbox
from tidings.pipeline.relay_query import start_relay
from tidings.server.store import EventStore
from tidings.targets.kinds.event_store import EventStoreTarget, EventStoreTargetConfig

WITNESS = witness_config(["t", "*"])


def _target(url: str, *modules: dict) -> EventStoreTarget:
    config = EventStoreTargetConfig(
        kind="event_store", url=url, type_prefix=["t"], modules=list(modules)
    )
    return EventStoreTarget("store", config)


def _outbox_event(n: int, event_type: str = "Created") -> OutboxEvent:
    return OutboxEvent(
        seq=n + 1,
        event_id=f"evt-{n}",
        event_type=event_type,
        payload=json.dumps({"n": n}),
        logged_at=datetime(2026, 1, 1, tzinfo=UTC),
        partition_key=f"k{n % 2}",
    )


def _stored(url: str) -> list[StoredEvent]:
    store = EventStore(url)
    try:
        return store.read(0, 10_000)
    finally:
        store.close()


def _witnessed(events: list[StoredEvent]) -> list[tuple[str | None, int]]:
    """Per witness event, in log order: the outbox id of the event it answers and the
    session it was stored in."""
    return [
        (json.loads(e.payload or b"")["of"], e.id.session) for e in events if e.type[0] == "witness"
    ]


def _relayed(events: list[StoredEvent]) -> list[tuple[str | None, int]]:
    return [(e.outbox_event_id, e.id.session) for e in events if e.type[0] == "t"]


def test_a_module_sees_every_event_and_its_additions_join_the_session(database_url: str) -> None:
    target = _target(database_url, WITNESS)
    try:
        assert target.publish([_outbox_event(n) for n in range(5)]) == [None] * 5
        assert target.publish([_outbox_event(5)]) == [None]
    finally:
        target.close()
    stored = _stored(database_url)
    assert _relayed(stored) == [(f"evt-{n}", 1) for n in range(5)] + [("evt-5", 2)]
    assert _witnessed(stored) == _relayed(stored)  # each answered once, in its own session
    assert {e.type for e in stored if e.type[0] == "witness"} == {("witness", "t", "Created")}
    # One session is one timestamp: the additions were stored with what they answer.
    assert len({e.timestamp_us for e in stored if e.id.session == 1}) == 1
    # Who registered them: the relay, and the module answering.
    store = EventStore(database_url)
    try:
        sources = store.sources_of([e.id for e in stored])
    finally:
        store.close()
    assert {sources[e.id] for e in stored if e.type[0] == "t"} == {RELAY_SOURCE}
    assert {sources[e.id].kind for e in stored if e.type[0] == "witness"} == {SourceKind.MODULE}


def test_a_batch_published_again_is_neither_stored_nor_processed_again(
    database_url: str,
) -> None:
    """A relay that crashed before recording its batch publishes it again, maybe from
    another worker (another engine): the events stored already are recognised by their
    outbox ids before the modules are offered them."""
    events = [_outbox_event(n) for n in range(4)]
    target = _target(database_url, WITNESS)
    try:
        assert target.publish(events[:2]) == [None, None]
        assert target.publish(events) == [None] * 4  # two of them new
        assert target.publish(events) == [None] * 4  # none new
    finally:
        target.close()
    restarted = _target(database_url, WITNESS)
    try:
        assert restarted.publish(events) == [None] * 4
    finally:
        restarted.close()
    stored = _stored(database_url)
    assert _relayed(stored) == [("evt-0", 1), ("evt-1", 1), ("evt-2", 2), ("evt-3", 2)]
    assert _witnessed(stored) == _relayed(stored)
    assert len(stored) == 8


def test_a_call_with_an_event_the_store_refuses_stores_nothing(tmp_path: Path) -> None:
    """The call is atomic: one refused event (a type the store cannot take) fails it whole,
    nothing of it stored or processed, so the relay narrows it down."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    target = _target(url, WITNESS)
    try:
        with pytest.raises(TargetCallFailed, match=r"event store target 'store' failed: .*event 1"):
            target.publish([_outbox_event(0), _outbox_event(1, "*"), _outbox_event(2)])
        assert target.publish([_outbox_event(0), _outbox_event(2)]) == [None, None]
    finally:
        target.close()
    assert _witnessed(_stored(url)) == [("evt-0", 1), ("evt-2", 1)]


def test_a_module_that_cannot_be_loaded_makes_the_target_unavailable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    target = _target(url, {"module": "tests.support.no_such_module"})
    try:
        with pytest.raises(
            TargetUnavailable,
            match=r"event store target 'store' cannot load its modules: ModuleLoadError: "
            r"module 'tests.support.no_such_module': cannot import it",
        ):
            target.publish([_outbox_event(0)])
    finally:
        target.close()
    assert _stored(url) == []


def test_modules_are_configured_as_a_servers_and_default_to_none() -> None:
    config = load_config({"targets": {"store": {"kind": "event_store"}}})
    assert config.targets["store"].modules == []  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"targets\.store\.event_store\.modules\.0\.module"):
        load_config({"targets": {"store": {"kind": "event_store", "modules": [{"n": 1}]}}})


def test_a_server_on_the_store_tells_its_subscribers_of_the_targets_sessions(
    tmp_path: Path,
) -> None:
    """The target writes beside a running server: its change feed tells subscribers of each
    session, the module's additions with the events they answer."""
    server = ServerProcess.tidings(
        tmp_path / "server", 1, {"eventer": free_port()}, backend=_sqlite(tmp_path)
    )
    server.start()
    target = _target(f"sqlite:///{tmp_path / 'events.db'}", WITNESS)

    async def subscribe_then_publish() -> list[list[StoredEvent]]:
        async with await connect(server.eventer) as client:
            await client.subscribe([("*",)])
            await asyncio.to_thread(target.publish, [_outbox_event(n) for n in range(3)])
            return [await asyncio.wait_for(client.receive(), 10)]

    try:
        [session] = run(subscribe_then_publish())
    finally:
        target.close()
        server.stop()
    assert [e.type[0] for e in session] == ["t"] * 3 + ["witness"] * 3
    assert len({e.id.session for e in session}) == 1
    # The wire carries no outbox ids: the witnesses name them.
    assert [of for of, _ in _witnessed(session)] == ["evt-0", "evt-1", "evt-2"]


def _sqlite(tmp_path: Path) -> dict[str, str]:
    return {"module": "tidings.server.backends.sqlite", "db_path": str(tmp_path / "events.db")}


# --- through the relay --------------------------------------------------------------------


@pytest.mark.spark
def test_relayed_events_reach_the_targets_module(spark, tmp_path: Path) -> None:
    """The relay's Spark workers run the module: every committed event is answered once,
    in the session it was stored in."""
    targets = {"store": store_target(tmp_path, modules=[WITNESS])}
    config = relay_config(tmp_path, targets=targets, max_events_per_batch=7)
    outbox = Outbox(make_engine(config.database.url))
    ids = []
    for n in range(20):
        with outbox.transaction() as tx:
            ids.append(tx.emit("Created", {"n": n}, partition_key=f"k{n % 3}"))
    start_relay(spark, config, available_now=True).awaitTermination()
    stored = store_events(config)
    assert sorted(i for i, _ in _relayed(stored)) == sorted(ids)
    assert sorted(_witnessed(stored)) == sorted(_relayed(stored))


def test_a_type_under_the_servers_reserved_consumer_prefix_is_refused(tmp_path: Path) -> None:
    """Only the event servers write stream consumer events: a prefix making them is a
    config error, and an outbox type completing a prefix to them is refused alone."""
    with pytest.raises(ConfigError, match="reserved prefix tidings/stream/consumer"):
        load_config(
            {
                "targets": {
                    "store": {
                        "kind": "event_store",
                        "url": f"sqlite:///{tmp_path / 'a.db'}",
                        "type_prefix": ["tidings", "stream", "consumer"],
                    }
                }
            }
        )
    url = f"sqlite:///{tmp_path / 'events.db'}"
    config = EventStoreTargetConfig(kind="event_store", url=url, type_prefix=["tidings", "stream"])
    target = EventStoreTarget("store", config)
    try:
        reserved = _outbox_event(0, "consumer")
        assert "reserved prefix tidings/stream/consumer" in (target.refusal(reserved) or "")
        assert target.refusal(_outbox_event(1)) is None
        with pytest.raises(TargetCallFailed, match="reserved prefix"):
            target.publish([reserved, _outbox_event(1)])
        assert target.publish([_outbox_event(1)]) == [None]
        with pytest.raises(TargetCallFailed, match="reserved prefix"):  # each time, alone
            target.publish([_outbox_event(2), reserved])
    finally:
        target.close()
    assert [e.type for e in _stored(url)] == [("tidings", "stream", "Created")]
