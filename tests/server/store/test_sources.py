"""Who registered each event: the store records the engine's sources (``event_sources``), on
SQLite and PostgreSQL, one row per run of a session's events from one source."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from tidings.events.model import EventId, NewEvent, StoredEvent, json_event
from tidings.events.sources import (
    ENGINE_SOURCE,
    RELAY_SOURCE,
    Source,
    SourceKind,
    eventer_source,
    module_source,
)
from tidings.server.engine import Engine, SessionEvent
from tidings.server.store import EventStore
from tidings.server.store.schema import event_sources_table


@pytest.fixture
def store(database_url: str) -> Iterator[EventStore]:
    opened = EventStore(database_url)
    yield opened
    opened.close()


class Answer:
    """A tidings module: answers ('q', x) with ('a', x), noting the source it was told."""

    subscription = (("q", "*"),)

    def __init__(self) -> None:
        self.seen: list[Source] = []

    def on_session_start(self, session_id: int) -> None:
        pass

    def on_session_stop(self, session_id: int) -> None:
        pass

    def process(self, session_id: int, event: SessionEvent) -> list[NewEvent]:
        self.seen.append(event.source)
        return [NewEvent(("a", *event.type[1:]))]


def _rows(store: EventStore) -> int:
    with store.snapshot() as conn:
        return int(conn.scalar(select(func.count()).select_from(event_sources_table)) or 0)


def test_each_event_has_its_registrations_source(store: EventStore) -> None:
    module = Answer()
    engine = Engine(store, [module])
    client = eventer_source(3, "alice")
    engine.register([NewEvent(("q", "1")), NewEvent(("other",))], source=client)
    engine.register([NewEvent(("plain",))])
    engine.register([json_event(("q", "2"), 1, outbox_event_id="o1")], source=RELAY_SOURCE)
    stored = store.read()
    sources = store.sources_of([e.id for e in stored])
    by_type = {e.type: sources[e.id] for e in stored}
    answering = module_source(0, "Answer")
    assert by_type == {
        ("q", "1"): client,
        ("other",): client,
        ("a", "1"): answering,
        ("plain",): ENGINE_SOURCE,
        ("q", "2"): RELAY_SOURCE,
        ("a", "2"): answering,
    }
    assert module.seen == [client, RELAY_SOURCE]  # the module was told, too
    assert _rows(store) == 5  # per session, one row per run of one source


def test_repeats_and_group_commits_record_one_source_per_stored_event(store: EventStore) -> None:
    """An outbox event registered again is not stored again, nor is its source; sessions
    stored together each keep their own."""
    engine = Engine(store, [])
    first, second = eventer_source(1), eventer_source(2)
    again = json_event(("t",), 1, outbox_event_id="o1")
    results = engine.register_many(
        [[again, again], [again, NewEvent(("u",))]], sources=[first, second]
    )
    assert all(isinstance(r, list) for r in results)
    stored = store.read()
    assert [e.type for e in stored] == [("t",), ("u",)]
    sources = store.sources_of([e.id for e in stored])
    assert [sources[e.id] for e in stored] == [first, second]


def test_deleting_events_drops_a_sessions_sources_only_with_its_last_event(
    store: EventStore,
) -> None:
    """Retention deletes events by position: a session that keeps an event keeps its source
    rows (a later event's source is read from the row of its run's first event), and a
    session deleted whole leaves none behind."""
    engine = Engine(store, [])
    alice, bob = eventer_source(1, "alice"), eventer_source(2, "bob")
    engine.register_many(
        [[NewEvent(("x",)), NewEvent(("y",))], [NewEvent(("z",))]], sources=[alice, bob]
    )
    engine.register([NewEvent(("w",))], source=alice)
    x, y, z, w = store.read()
    rows_before = _rows(store)
    store.delete_positions([x.position])  # y's run began at x: its row must stay
    assert store.sources_of([y.id]) == {y.id: alice}
    assert _rows(store) == rows_before
    store.delete_positions([y.position, z.position])  # both sessions now empty
    assert _rows(store) == rows_before - 2
    assert store.sources_of([w.id]) == {w.id: alice}


def test_events_without_a_recorded_source_have_none(store: EventStore) -> None:
    """Synced events (their source is on their origin server) and events stored before
    tidings recorded sources are left out of the answer."""
    peer_event = StoredEvent(0, EventId(9, 1, 1), ("s",), 1, None, None, None, None)
    [synced] = store.append_synced([peer_event])
    assert store.sources_of([synced.id]) == {}


def test_a_store_made_before_sources_gets_the_table(database_url: str) -> None:
    """An existing store without ``event_sources`` (an older tidings made it) gets the table
    when it is opened, and its old events simply have no source."""
    store = EventStore(database_url)
    [old] = store.register([NewEvent(("old",))])
    with store.transaction("drop the table") as conn:
        event_sources_table.drop(conn)
    store.close()
    store = EventStore(database_url)
    try:
        [new] = Engine(store, []).register([NewEvent(("new",))], source=RELAY_SOURCE)
        assert new is not None
        assert store.sources_of([old.id, new.id]) == {new.id: RELAY_SOURCE}
    finally:
        store.close()


def test_a_source_is_checked() -> None:
    with pytest.raises(Exception, match="id must be an int >= 0"):
        Source(SourceKind.MODULE, -1)
    with pytest.raises(Exception, match="kind must be a SourceKind"):
        Source("module", 1)  # type: ignore[arg-type]
    assert str(eventer_source(2, "relay")) == "eventer 2 (relay)"
