"""The newest event of each key of one type, read from the store on SQLite and PostgreSQL
(what an intermediary loads a table from instead of replaying its history), and the same
over the Eventer wire with the public client."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server_helpers import running
from tidings.client import ClientError, connect, json_event
from tidings.errors import StoreError
from tidings.events.model import NewEvent, PayloadKind, StoredEvent
from tidings.server.store import EventStore, events_from_rows
from tidings.server.store.latest_by_key import latest_by_key_rows

ROWS = ("db", "rows.users")


@pytest.fixture
def store(database_url: str) -> Iterator[EventStore]:
    store = EventStore(database_url, server_id=1)
    yield store
    store.close()


def _row(
    key: Any, value: Any, *, envelope: bool = False, type_: tuple[str, ...] = ROWS
) -> NewEvent:
    payload: Any = (
        {"key": key, "row": {"v": value}} if value is not None else {"key": key, "deleted": True}
    )
    if envelope:
        payload = {"specversion": "1.0", "id": "x", "data": payload}
    return NewEvent(type=type_, payload=json.dumps(payload).encode(), payload_kind=PayloadKind.JSON)


def _latest(store: EventStore, event_type: tuple[str, ...] = ROWS) -> list[StoredEvent]:
    return [
        e
        for rows in latest_by_key_rows(store, event_type, chunk_rows=7)
        for e in events_from_rows(rows)
    ]


def _key(event: StoredEvent) -> str | None:
    """The row key of a row event as JSON (None: not a row event)."""
    payload = (
        json.loads(event.payload or b"null") if event.payload_kind is PayloadKind.JSON else None
    )
    if isinstance(payload, dict) and "specversion" in payload:
        payload = payload["data"]
    return json.dumps(payload["key"]) if isinstance(payload, dict) and "key" in payload else None


def _fold(events: list[StoredEvent]) -> dict[str, Any]:
    """Replay: per key the id of its last event."""
    return {key: event.id for event in events if (key := _key(event)) is not None}


def test_the_newest_event_of_each_key_is_what_a_replay_keeps(store: EventStore) -> None:
    """Random changes of 40 keys (plain, composite, and "1" beside 1), some in CloudEvents
    envelopes, deletions among them, mixed with other types and payload kinds: one event per
    key, the newest, in the store's order, folding to what the whole history folds to."""
    rng = random.Random(7)
    keys: list[Any] = [*range(30), *(str(i) for i in range(5)), *([i, "x"] for i in range(5))]
    history: list[StoredEvent] = []
    for _ in range(20):
        batch = [
            _row(rng.choice(keys), rng.choice([None, 1, 2.5, "z"]), envelope=rng.random() < 0.3)
            for _ in range(25)
        ]
        batch.append(_row(1, "other type", type_=("db", "rows.orders")))
        batch.append(NewEvent(type=ROWS, payload=b"\x00", payload_kind=PayloadKind.BINARY))
        batch.append(NewEvent(type=ROWS, payload=b'{"no": "key"}', payload_kind=PayloadKind.JSON))
        history += [
            e
            for e in store.register(batch)
            if e.type == ROWS and e.payload_kind is PayloadKind.JSON
        ]
    latest = _latest(store)
    assert _fold(latest) == _fold(history)
    assert len(latest) == len(_fold(history))
    assert [e.position for e in latest] == sorted(e.position for e in latest)


def test_an_unknown_type_is_empty_and_a_pattern_is_refused(store: EventStore) -> None:
    store.register([_row(1, 1)])
    assert _latest(store, ("db", "rows.nothing")) == []
    with pytest.raises(StoreError, match="expected an exact event type"):
        _latest(store, ("db", "*"))


def test_the_client_gets_the_latest_by_key_and_a_pattern_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv, await connect(srv.address) as client:
            await client.register_with_response(
                [
                    json_event(ROWS, {"key": k, "row": {"v": v}})
                    for k, v in [(1, "a"), (2, "b"), (1, "c")]
                ]
            )
            latest = await client.query_latest_by_key(ROWS)
            assert [json.loads(e.payload or b"")["row"]["v"] for e in latest] == ["b", "c"]
            with pytest.raises(ClientError, match="expected an exact type"):
                await client.query_latest_by_key(("db", "?"))
            assert client.is_open

    asyncio.run(asyncio.wait_for(main(), 60))
