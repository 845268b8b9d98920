"""The consumer events stay few: however many acknowledgements, one per consumer and origin
server once a compaction pass has run, with or without stream retention, on real stores (a
pair of SQLite files, or each backend) and on a running server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stream_helpers import add_events, call, poll, serving, stream_server_config
from tests.support.waiting import run, until
from tidings.events.model import EventId, PayloadKind, StoredEvent, json_event
from tidings.server.store import EventStore
from tidings.streams.consumers.compaction import compaction_pass
from tidings.streams.consumers.positions import Consumers
from tidings.streams.consumers.replication import consumer_event
from tidings.streams.consumers.sync import ConsumerSync
from tidings.streams.typemap import CONSUMER_TYPE, is_consumer_type

S, U = "s", "ftn18"
#: Acknowledgements per consumer.
N = 50


def _consumer_events(store: EventStore) -> list[StoredEvent]:
    return [e for e in store.read(0, 100_000) if is_consumer_type(e.type)]


def _own_of(store: EventStore) -> list[StoredEvent]:
    """What ``store``'s Syncer serves a peer: its own events."""
    return [e for e in store.read(0, 100_000) if e.id.server == store.server_id]


def _acknowledge_one_by_one(store: EventStore, consumers: Consumers, component: str) -> None:
    """What the stream service does for ``component`` reading ``N`` events one at a time:
    each acknowledgement that moves it writes a consumer event with its covers."""
    consumers.register(S, U, component)
    store.register([consumer_event(store.server_id, S, U, component, {})])
    for _ in range(N):
        [event] = store.register([json_event(("orders", component), {})])
        _, covers = consumers.acknowledge(S, U, component, event.position)
        assert covers is not None
        store.register([consumer_event(store.server_id, S, U, component, covers)])


def _catch_up(store: EventStore, consumers: Consumers) -> int:
    return ConsumerSync(store, consumers, executor=None).catch_up()  # type: ignore[arg-type]


def test_n_acknowledgements_leave_one_consumer_event_per_consumer_and_origin(
    tmp_path: Path,
) -> None:
    a, b = EventStore(f"sqlite:///{tmp_path}/a.db", 1), EventStore(f"sqlite:///{tmp_path}/b.db", 2)
    on_a, on_b = Consumers(a), Consumers(b)
    for component in ("C", "D"):
        _acknowledge_one_by_one(a, on_a, component)
    _acknowledge_one_by_one(b, on_b, "C")  # the same consumer, acknowledging on B too
    b.append_synced(_own_of(a))
    a.append_synced(_own_of(b))
    assert len(_consumer_events(a)) == 3 * (N + 1)

    # A has not applied B's consumer events yet: of those, none goes; of its own, all but
    # the latest of each consumer.
    assert compaction_pass(a, on_a) == 2 * N
    assert len(_consumer_events(a)) == 2 + N + 1
    _catch_up(a, on_a)
    assert compaction_pass(a, on_a) == N
    left = _consumer_events(a)
    assert sorted(e.type[len(CONSUMER_TYPE) :] for e in left) == [
        (S, U, "C", "1"),
        (S, U, "C", "2"),
        (S, U, "D", "1"),
    ]
    assert compaction_pass(a, on_a) == 0

    # B applies what A's compaction left as it would have applied everything: a consumer
    # event carries its consumer's whole covers.
    _catch_up(b, on_b)
    before = {c: on_b.position(S, U, c) for c in ("C", "D")}
    assert compaction_pass(b, on_b) == 3 * N
    assert len(_consumer_events(b)) == 3
    assert {c: on_b.position(S, U, c) for c in ("C", "D")} == before
    for store in (a, b):
        store.close()


def test_a_peer_that_syncs_after_a_compaction_gets_the_whole_position(
    tmp_path: Path, database_url: str
) -> None:
    """B was down while A compacted: the Syncer brings it A's events after the last it
    holds, the latest consumer events among them, and B moves its consumers as far as all
    of A's consumer events would have moved them."""
    a, b = EventStore(database_url, 1), EventStore(f"sqlite:///{tmp_path}/b.db", 2)
    on_a, on_b = Consumers(a), Consumers(b)
    _acknowledge_one_by_one(a, on_a, "C")
    b.append_synced(_own_of(a)[:10])  # B had part before it went down
    _catch_up(b, on_b)
    assert 0 < on_b.position(S, U, "C") < N
    assert compaction_pass(a, on_a) == N
    b.append_synced(_own_of(a))
    assert _catch_up(b, on_b) == 1
    assert on_b.covers(S, U, "C") == on_a.covers(S, U, "C")
    last_read = max(e.position for e in b.read(0, 100_000) if not is_consumer_type(e.type))
    assert on_b.position(S, U, "C") == last_read
    a.close()
    b.close()


def test_an_unregistered_consumer_keeps_no_consumer_event(tmp_path: Path) -> None:
    """Kept, its latest consumer event would register it again on a server that syncs A
    later; and a peer's malformed consumer event goes once the sync has passed it."""
    a, b = EventStore(f"sqlite:///{tmp_path}/a.db", 1), EventStore(f"sqlite:///{tmp_path}/b.db", 2)
    on_a, on_b = Consumers(a), Consumers(b)
    _acknowledge_one_by_one(a, on_a, "GONE")
    _acknowledge_one_by_one(a, on_a, "KEPT")
    malformed = StoredEvent(
        0, EventId(2, 1, 1), (*CONSUMER_TYPE, S), 1, None, b"[]", PayloadKind.JSON, None
    )
    a.append_synced([malformed])
    assert on_a.unregister(S, U, "GONE")
    assert compaction_pass(a, on_a) == 2 * N + 1  # the malformed one is not applied yet
    _catch_up(a, on_a)
    assert compaction_pass(a, on_a) == 1
    [kept] = _consumer_events(a)
    assert kept.type[len(CONSUMER_TYPE) : -1] == (S, U, "KEPT")
    b.append_synced(_own_of(a))
    _catch_up(b, on_b)
    assert [c.component for c in on_b.of_stream(S)] == ["KEPT"]
    for store in (a, b):
        store.close()


@pytest.mark.sockets
def test_a_server_without_retention_compacts_its_consumer_events(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    config = stream_server_config(url, secure_channel=True)
    config["stream_consumer_events"] = {"compact_every": "50ms"}

    def stored() -> tuple[int, int]:
        """(consumer events, other events) in the store."""
        store = EventStore(url)
        try:
            events = store.read(0, 100_000)
        finally:
            store.close()
        consumer = sum(1 for e in events if is_consumer_type(e.type))
        return consumer, len(events) - consumer

    async def scenario() -> None:
        async with serving(config) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "A"})
            ids = await add_events(server.url, 30)
            _, others = stored()
            for event_id in ids:  # 30 acknowledgements, each moving the consumer
                await poll(server.url, "A", event_id)
            await until(lambda: stored() == (1, others), 10)  # the other events all stay
            reply = await poll(server.url, "A")
            assert reply["r"] == []  # its position is intact

    run(scenario(), timeout=60)
