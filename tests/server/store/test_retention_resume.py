"""Retention does not make the Syncer fetch a peer's events again: the store keeps each
server's greatest received id (its mark) after retention has deleted the events, and the
Syncer resumes after it. Real servers on 127.0.0.1, real SQLite files and PostgreSQL."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from bench.harness.processes import free_port, local_address
from tests.support.server_helpers import async_engine
from tests.support.stream_helpers import add_events, call, poll, serving, stream_server_config
from tests.support.waiting import run, until
from tidings.client import json_event
from tidings.events.model import EventId, PayloadKind, StoredEvent
from tidings.server.store import EventStore
from tidings.server.store.retention import discard
from tidings.server.syncer.server import SyncerServer

pytestmark = [pytest.mark.sockets, pytest.mark.timeout(120)]

RETAIN = {"enabled": True, "min_age": "0s", "every": "50ms"}
ORDER = ("orders", "created")  # the stream's ORDER type (tests.support.stream_helpers.TYPES)


def _of_server(store: EventStore, server: int) -> list[StoredEvent]:
    return [e for e in store.read(0, 100_000) if e.id.server == server]


def _ids(store: EventStore, server: int) -> set[EventId]:
    return {e.id for e in _of_server(store, server)}


def _orders_of(store: EventStore, server: int) -> list[object]:
    """The payloads of ``server``'s ORDER events in ``store``."""
    return [json.loads(e.payload or b"") for e in _of_server(store, server) if e.type == ORDER]


def test_a_peers_events_deleted_by_retention_are_not_fetched_and_delivered_again(
    tmp_path: Path, database_url: str
) -> None:
    syncer_address = local_address(free_port())
    config = stream_server_config(database_url, secure_channel=True, retention=RETAIN)
    config["engine"]["server_id"] = 2
    config["syncer_peers"] = [{"server_id": 1, "address": syncer_address}]

    async def scenario() -> None:
        async with async_engine(tmp_path / "a.db", server_id=1) as a:
            syncer_a = await SyncerServer.start(syncer_address, a)
            reader = EventStore(database_url, server_id=2)  # B's store, read beside B
            try:
                async with serving(config) as b:
                    await call(b.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "C"})
                    # A's Syncer status events first: A's ORDER events are its latest.
                    await until(lambda: [synced for _, synced in syncer_a.clients] == [True])
                    await until(lambda: _ids(a.store, 1) == _ids(reader, 1))
                    for n in range(3):
                        await a.register([json_event(ORDER, {"from": "a", "n": n})])
                    await until(lambda: len(_orders_of(reader, 1)) == 3)
                    last_of_a = a.store.last_event_id()
                    # B's own later events of the type, so that A's are not its latest.
                    own = await add_events(b.url, 2, "ORDER")
                    delivered = (await poll(b.url, "C"))["r"]
                    assert [e["data"].get("from") for e in delivered] == ["a"] * 3 + [None] * 2
                    await poll(b.url, "C", own[-1])  # C has read everything
                    await until(lambda: not _orders_of(reader, 1))
                    assert reader.last_event_id(1) == last_of_a

                    # B's Syncer reconnects to A, which has one new event meanwhile.
                    await syncer_a.aclose()
                    await a.register([json_event(ORDER, {"from": "a", "n": "new"})])
                    syncer_a = await SyncerServer.start(syncer_address, a)
                    await until(lambda: [synced for _, synced in syncer_a.clients] == [True])
                    await until(lambda: bool(_orders_of(reader, 1)))
                    assert _orders_of(reader, 1) == [{"from": "a", "n": "new"}]
                    delivered = (await poll(b.url, "C", own[-1]))["r"]
                    assert [e["data"] for e in delivered] == [{"from": "a", "n": "new"}]
            finally:
                reader.close()
                await syncer_a.aclose()

    run(scenario(), timeout=90)


def test_a_store_made_before_the_marks_starts_them_from_its_stored_events(
    database_url: str,
) -> None:
    now = int(time.time() * 1_000_000)
    events = [
        StoredEvent(
            0, EventId(1, session, instance), ORDER, now - 10, None, b"{}", PayloadKind.JSON, None
        )
        for session, instance in ((1, 1), (1, 2), (2, 3))
    ]
    store = EventStore(database_url, server_id=2)
    store.append_synced(events)
    with store.transaction("drop the marks") as conn:  # as an older tidings left the store
        conn.execute(text("DROP TABLE event_server_marks"))
    store.close()

    store = EventStore(database_url, server_id=2)
    try:
        assert discard(store, [ORDER], store.last_position(), [], now) == 2  # the latest stays
        store.register([json_event(ORDER, {"later": True})])
        assert discard(store, [ORDER], store.last_position(), [], now + 10**9) == 1
        assert not _of_server(store, 1)
        assert store.last_event_id(1) == EventId(1, 2, 3)
        assert store.last_event_id(3) == EventId(3, 0, 0)
        # A later, lower id (a peer's store restored from a backup) does not move it back.
        store.append_synced([events[0]])
        assert store.last_event_id(1) == EventId(1, 2, 3)
    finally:
        store.close()
