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
from tests.support.waiting import run
from tidings.client import ClientError, connect, json_event
from tidings.errors import StoreError
from tidings.events.model import EventId, NewEvent, PayloadKind, StoredEvent
from tidings.server.store import EventStore, events_from_rows
from tidings.server.store.latest_by_key import latest_by_key_rows
from tidings.wire import chatter_client, codec

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


def _latest(
    store: EventStore, event_type: tuple[str, ...] = ROWS, after: EventId | None = None
) -> list[StoredEvent]:
    return [
        e
        for rows in latest_by_key_rows(store, event_type, chunk_rows=7, after=after)
        for e in events_from_rows(rows)
    ]


def _random_history(store: EventStore, rng: random.Random, sessions: int) -> list[StoredEvent]:
    """Random changes and deletions of 50 keys; the row events stored."""
    history: list[StoredEvent] = []
    for _ in range(sessions):
        batch = [_row(rng.randrange(50), rng.choice([None, 1, "z"])) for _ in range(20)]
        history += store.register(batch)
    return history


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


def test_a_page_after_an_event_holds_the_keys_whose_newest_comes_after_it(
    store: EventStore,
) -> None:
    history = _random_history(store, random.Random(3), 10)
    latest = _latest(store)
    for cursor in latest:
        after = [e for e in latest if e.position > cursor.position]
        assert _latest(store, after=cursor.id) == after
    assert _latest(store, after=history[-1].id) == []


def test_pages_read_while_the_table_changes_fold_to_its_newest_state(store: EventStore) -> None:
    """A key changed between two pages comes again, newer; none is missed or older."""
    rng = random.Random(5)
    history = _random_history(store, rng, 10)
    first = _latest(store)[:20]
    history += _random_history(store, rng, 3)
    rest = _latest(store, after=first[-1].id)
    assert _fold(first + rest) == _fold(history)


def test_a_cursor_deleted_meanwhile_repeats_keys_but_skips_none(store: EventStore) -> None:
    """Retention may delete the page's last event before the next page is asked for: the
    next page then starts at the server's event before it."""
    history = _random_history(store, random.Random(9), 10)
    latest = _latest(store)
    cursor = latest[len(latest) // 2]
    expected = _latest(store, after=cursor.id)
    assert store.delete_positions([cursor.position]) == 1
    before = max(e.position for e in history if e.position < cursor.position)
    after_deleted = _latest(store, after=cursor.id)
    assert after_deleted == [e for e in _latest(store) if e.position > before]
    assert set(_fold(expected)) <= set(_fold(after_deleted))


def test_a_cursor_out_of_range_is_refused(store: EventStore) -> None:
    with pytest.raises(StoreError, match=r"lastEventId\.session must be between"):
        _latest(store, after=EventId(1, 2**63, 1))


def test_the_client_reads_a_table_larger_than_its_frame_limit_in_pages(tmp_path: Path) -> None:
    async def main() -> tuple[list[StoredEvent], list[StoredEvent], int]:
        async with running(tmp_path) as srv:
            async with await connect(srv.address) as client:
                for session in range(6):
                    await client.register_with_response(
                        [_row(key, "v" * 40 + str(session)) for key in range(100)]
                    )
                whole = await client.query_latest_by_key(ROWS)
            queries = srv.server.counters.queries
            async with await connect(srv.address, max_frame_bytes=8192) as client:
                paged = await client.query_latest_by_key(ROWS)
            return whole, paged, srv.server.counters.queries - queries

    whole, paged, requests = run(main())
    assert len(whole) == 100
    assert paged == whole
    assert requests >= 3  # ~15 KB of events in pages under 8 KiB, and the empty last one


def test_the_server_bounds_a_page_by_the_bytes_asked_for(tmp_path: Path) -> None:
    async def main() -> list[int]:
        async with running(tmp_path) as srv:
            async with await connect(srv.address) as client:
                await client.register_with_response([_row(key, key) for key in range(10)])
            connection = await chatter_client.connect(srv.address)
            try:
                counts = []
                for max_bytes in (1, 200, None):
                    request = codec.latest_by_key_request_to_sbs(list(ROWS), None, max_bytes)
                    reply = await connection.request(
                        codec.TIDINGS_EVENTER, "MsgLatestByKeyReq", request
                    )
                    events = codec.events_from_sbs(reply.data, "MsgQueryRes")
                    if max_bytes == 200:
                        assert sum(len(codec.encode_event(e)) for e in events) <= max_bytes
                    counts.append(len(events))
                return counts
            finally:
                await connection.aclose()

    one, some, every = run(main())
    assert one == 1  # at least one event, however small the bound
    assert 1 < some < every == 10
