"""Consumer positions across a redundant pair, on two real SQLite stores whose logs hold the
same events in different orders (each server's own first, the peer's as the Syncer stores
them: with their ids, in their origin's order)."""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tidings.errors import StreamError
from tidings.events.model import EventId, PayloadKind, StoredEvent, json_event
from tidings.server.store import EventStore
from tidings.streams.consumers.positions import Consumers
from tidings.streams.consumers.replication import consumer_event, read_consumer_event
from tidings.streams.consumers.sync import ConsumerSync
from tidings.streams.typemap import CONSUMER_TYPE, TypeMap
from tidings.tasks import stop_task

S, U = "s", "ftn18"


def _pair(tmp_path: Path, a_url: str | None = None) -> tuple[EventStore, EventStore]:
    """Servers 1 and 2 (server 1 on ``a_url`` if given)."""
    a = EventStore(a_url or f"sqlite:///{tmp_path}/a.db", 1)
    return a, EventStore(f"sqlite:///{tmp_path}/b.db", 2)


def _own(store: EventStore, *names: str) -> list[StoredEvent]:
    return store.register([json_event(("orders", name), {"name": name}) for name in names])


def _positions(store: EventStore) -> dict[EventId, int]:
    return {e.id: e.position for e in store.read(0, 10_000)}


def test_a_position_moves_to_the_peer_as_far_as_its_own_order_allows(
    tmp_path: Path, database_url: str
) -> None:
    a, b = _pair(tmp_path, database_url)
    a_events = _own(a, "a1", "a2")
    b_events = _own(b, "b1")
    b.append_synced(a_events)  # B: b1 a1 a2
    a.append_synced(b_events)  # A: a1 a2 b1
    on_a, on_b = Consumers(a), Consumers(b)
    on_a.register(S, U, "C")

    position, covers = on_a.acknowledge(S, U, "C", 2)  # a1 a2 read on A
    assert (position, covers) == (2, {1: (a_events[1].id.session, a_events[1].id.instance)})
    assert covers is not None
    # On B, b1 comes first and was not read: the consumer starts before it there (a1 and
    # a2 come again: duplicates, never a loss).
    assert on_b.apply(S, U, "C", covers) == 0
    assert on_b.position(S, U, "C") == 0

    _, covers = on_a.acknowledge(S, U, "C", 3)  # b1 read on A too
    assert covers is not None and set(covers) == {1, 2}
    assert on_b.apply(S, U, "C", covers) == 3  # everything B holds
    assert on_b.covers(S, U, "C") == covers

    # Covers only grow: an older word from the peer moves nothing back.
    assert on_b.apply(S, U, "C", {1: (a_events[0].id.session, a_events[0].id.instance)}) == 3
    assert on_b.covers(S, U, "C") == covers


def test_acknowledging_on_the_peer_continues_from_the_covers(
    tmp_path: Path, database_url: str
) -> None:
    b, a = _pair(tmp_path, database_url)  # the peer (server 1) on each backend
    first = _own(a, "a1", "a2", "a3")
    b.append_synced(first)
    on_a, on_b = Consumers(a), Consumers(b)
    on_a.register(S, U, "C")
    _, covers = on_a.acknowledge(S, U, "C", 2)
    assert covers is not None
    assert on_b.apply(S, U, "C", covers) == 2
    # The consumer moved to B, which took new events; it acknowledges there.
    _own(b, "b1")
    _, grown = on_b.acknowledge(S, U, "C", 4)
    assert grown is not None
    assert grown[a.server_id] == (first[2].id.session, first[2].id.instance)
    assert grown[b.server_id] == (b.last_event_id().session, b.last_event_id().instance)
    # Acknowledging what is acknowledged already tells the group nothing.
    assert on_b.acknowledge(S, U, "C", 3) == (4, None)


def _relayed(store: EventStore, outbox_id: str) -> StoredEvent:
    """The outbox event ``outbox_id`` as the relay stores it on ``store``."""
    [event] = store.register([json_event(("orders", "E"), {"e": 1}, outbox_event_id=outbox_id)])
    return event


def _own_of(store: EventStore) -> list[StoredEvent]:
    """What ``store``'s Syncer serves a peer: its own events."""
    return [e for e in store.read(0, 10_000) if e.id.server == store.server_id]


def test_a_peers_copy_of_an_event_held_under_another_id_counts_as_covered(
    tmp_path: Path, database_url: str
) -> None:
    """The relay sent E to A, lost A before A's answer (and before A's Syncer carried E),
    and sent E again to B: each store holds E under its own id, and each skips the other's
    copy when it arrives. A consumer that read E on A must not get E, nor anything before
    it, again on B; nor, the other way, what it read on B again on A."""
    a, b = _pair(tmp_path, database_url)
    [a1] = _own(a, "a1")
    b.append_synced([a1])  # synced before the trouble
    e_a = _relayed(a, "E")
    e_b = _relayed(b, "E")  # the relay's second try, to B
    [b2] = _own(b, "b2")
    b.append_synced(_own_of(a))  # A is back: E_A arrives at B, held as E_B
    a.append_synced(_own_of(b))  # and E_B at A
    assert [e.id for e in b.read(0, 100)] == [a1.id, e_b.id, b2.id]
    assert [e.id for e in a.read(0, 100)] == [a1.id, e_a.id, b2.id]
    on_a, on_b = Consumers(a), Consumers(b)

    on_a.register(S, U, "C")
    _, covers = on_a.acknowledge(S, U, "C", e_a.position)  # a1 and E read on A
    assert covers == {1: (e_a.id.session, e_a.id.instance)}
    # On B, E is E_B: covered by its copy's id, so the consumer continues after it with b2.
    assert on_b.apply(S, U, "C", covers) == e_b.position
    assert [e.id for e in b.read(on_b.position(S, U, "C"), 100)] == [b2.id]

    on_b.register(S, U, "D")
    _, covers = on_b.acknowledge(S, U, "D", b2.position)  # everything, read on B
    assert covers == {1: (a1.id.session, a1.id.instance), 2: (b2.id.session, b2.id.instance)}
    assert on_a.apply(S, U, "D", covers) == b2.position  # E_A counted by E_B


def test_consumer_events_are_passed_over_and_never_counted(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    events = _own(a, "a1")
    a.register([consumer_event(1, S, U, "OTHER", {})])
    events += _own(a, "a2")
    a.register([consumer_event(1, S, U, "OTHER", {})])  # position 4
    b.append_synced(a.read(0, 100))
    on_a, on_b = Consumers(a), Consumers(b)
    on_a.register(S, U, "C")
    _, covers = on_a.acknowledge(S, U, "C", 3)
    assert covers == {1: (events[1].id.session, events[1].id.instance)}
    # Moving over a consumer event alone grows no covers: nothing to tell the group (were
    # it told, that would be one more consumer event to move over, without end).
    assert on_a.acknowledge(S, U, "C", 4) == (4, None)
    # The peer moves over the consumer events its covers do not name (up to its last
    # covered event: the one after it is left to be passed over when read, never sent).
    assert on_b.apply(S, U, "C", covers) == 3


def test_the_peers_own_events_outside_the_stream_do_not_hold_a_position_back(
    tmp_path: Path, database_url: str
) -> None:
    """B's own status events (its Syncer's ``('event', 'syncer', ...)``) fall between A's
    events in B's log, but after them in A's, where a consumer that read A's events has not
    passed them: its covers do not name them. They are not in the stream, so the consumer
    moves over them on B; without the stream's types (a stream B does not serve) they stop
    it, as before: duplicates at worst, never a loss. An event of the stream the covers do
    not name still stops it."""
    a, b = _pair(tmp_path, database_url)
    first = _own(a, "a1")
    b.append_synced(first)
    b.register([json_event(("event", "syncer", "client", "1", "synced"), True)])
    then = _own(a, "a2", "a3")
    b.append_synced(then)  # B: a1 status a2 a3
    on_a = Consumers(a)
    on_a.register(S, U, "C")
    _, covers = on_a.acknowledge(S, U, "C", 3)  # A: a1 a2 a3, all read
    assert covers is not None and set(covers) == {1}
    stream_types = TypeMap({"ORDER": (("orders", "*"),)})
    on_b = Consumers(b, {S: stream_types.carries})
    assert on_b.apply(S, U, "C", covers) == _positions(b)[then[-1].id] == 4
    # Another stream's consumer (no types known for it here) stops at the status event.
    assert Consumers(b).apply("other", U, "C", covers) == _positions(b)[first[0].id]
    # An event of the stream that the covers do not name stops the consumer.
    [late] = _own(b, "b1")
    b.append_synced(_own(a, "a4"))
    assert on_b.apply(S, U, "C", covers) == 4
    assert late.position == 5


def test_apply_registers_and_unregister_forgets_the_covers(tmp_path: Path) -> None:
    a, _ = _pair(tmp_path)
    consumers = Consumers(a)
    _own(a, "a1")
    assert consumers.apply(S, U, "NEW", {}) == 0  # registered by a peer's word
    assert not consumers.register(S, U, "NEW")
    consumers.apply(S, U, "NEW", {1: (1, 1)})
    assert consumers.position(S, U, "NEW") == 1
    assert consumers.unregister(S, U, "NEW")
    assert consumers.covers(S, U, "NEW") == {}


def test_the_sync_applies_the_peers_consumer_events_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = _pair(tmp_path)
    _own(a, "a1", "a2")
    on_a, on_b = Consumers(a), Consumers(b)
    on_a.register(S, U, "C")
    _, covers = on_a.acknowledge(S, U, "C", 2)
    assert covers is not None
    a.register([consumer_event(1, S, U, "C", covers)])
    b.register([consumer_event(2, S, U, "MINE", {1: (1, 2)})])  # B's own: B applied it itself
    b.append_synced(a.read(0, 100))
    sync = ConsumerSync(b, on_b, executor=None)  # type: ignore[arg-type]  # catch_up only
    assert sync.catch_up() == 1
    assert on_b.position(S, U, "C") == 3  # a1 a2 and A's consumer event
    assert [c.component for c in on_b.of_stream(S)] == ["C"]
    assert sync.catch_up() == 0  # already applied: from where it stopped

    bad = StoredEvent(
        0, EventId(1, 9, 1), (*CONSUMER_TYPE, S), 1, None, b"[]", PayloadKind.JSON, None
    )
    b.append_synced([bad])
    with caplog.at_level(logging.WARNING):
        assert sync.catch_up() == 0
    assert "peer consumer event skipped" in caplog.text
    with pytest.raises(StreamError, match=r"consumer event EventId.* is malformed"):
        read_consumer_event(bad)


def test_no_stream_carries_consumer_events() -> None:
    types = TypeMap({"ALL": (("*",),)})
    assert types.name_of(("orders", "x")) == "ALL"
    assert types.name_of((*CONSUMER_TYPE, S)) is None


def _peer_event(
    server: int, instance: int, payload: bytes, consumer: tuple[str, str, str] = (S, U, "C")
) -> StoredEvent:
    """A consumer event as the Syncer stores a peer's: its type names ``server``."""
    return StoredEvent(
        0,
        EventId(server, 1, instance),
        (*CONSUMER_TYPE, *consumer, str(server)),
        1,
        None,
        payload,
        PayloadKind.JSON,
        None,
    )


def _payload(consumer: tuple[str, str, str], covers: list[list[int]]) -> bytes:
    stream, user, component = consumer
    text = {"stream": stream, "user": user, "component": component, "covers": covers}
    return json.dumps(text).encode()


def test_bad_peer_consumer_events_are_skipped_and_the_valid_one_after_them_applied(
    tmp_path: Path, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    here, peer = _pair(tmp_path, database_url)  # the syncing server (1) on each backend
    events = _own(peer, "p1", "p2")
    here.append_synced(events)
    consumers = Consumers(here)
    long_name = (S, U, "C" * 17)
    forged = StoredEvent(  # says it is server 3's word, but server 2 wrote it
        0,
        EventId(2, 1, 9),
        (*CONSUMER_TYPE, S, U, "C", "3"),
        1,
        None,
        _payload((S, U, "C"), [[2, 1, 2]]),
        PayloadKind.JSON,
        None,
    )
    here.append_synced(
        [
            _peer_event(2, 3, b"[" * 100_000 + b"]" * 100_000),
            _peer_event(2, 4, _payload((S, U, "C"), [[2, 2**64, 1]])),
            _peer_event(2, 5, _payload(long_name, [[2, 1, 1]]), long_name),
            _peer_event(2, 6, _payload(("s" * 65, U, "C"), [[2, 1, 1]]), ("s" * 65, U, "C")),
            _peer_event(2, 7, _payload((S, U, "C\x00"), [[2, 1, 1]]), (S, U, "C\x00")),
            _peer_event(2, 8, _payload((S, U, "C\ud800"), [[2, 1, 1]]), (S, U, "C\ud800")),
            forged,
            _peer_event(2, 10, _payload((S, U, "C"), [[2, 1, 1]])),
        ]
    )
    sync = ConsumerSync(here, consumers, executor=None)  # type: ignore[arg-type]  # catch_up only
    with caplog.at_level(logging.WARNING):
        assert sync.catch_up() == 1
    assert caplog.text.count("peer consumer event skipped") == 7
    reasons = " ".join(getattr(r, "error", "") for r in caplog.records)
    assert "RecursionError" in reasons and "outside 1.." in reasons
    assert "not that of its payload and origin" in reasons
    assert [c.component for c in consumers.of_stream(S)] == ["C"]
    assert consumers.position(S, U, "C") == 1  # p1, as the valid event said; not p2
    # Past them for good: the next catch-up reads nothing again.
    caplog.clear()
    assert sync.catch_up() == 0
    assert "skipped" not in caplog.text


def test_the_sync_task_outlives_an_unexpected_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    here, peer = _pair(tmp_path)
    events = _own(peer, "p1")
    here.append_synced([*events, _peer_event(2, 2, _payload((S, U, "C"), [[2, 1, 1]]))])
    consumers = Consumers(here)
    # A fake fault: the checks before the database leave no real event that fails here, so
    # the first catch-up is made to fail as a bug would.
    executor = ThreadPoolExecutor(1)
    sync = ConsumerSync(here, consumers, executor)
    real, calls = sync.catch_up, []

    def failing_once() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return real()

    monkeypatch.setattr(sync, "catch_up", failing_once)
    monkeypatch.setattr("tidings.streams.consumers.sync._RETRY", 0.05)

    async def run_a_while() -> None:
        task = asyncio.get_running_loop().create_task(sync.run())
        try:
            for _ in range(200):
                if len(calls) > 1:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            assert not task.done()
        finally:
            await stop_task(task)

    with caplog.at_level(logging.WARNING):
        asyncio.run(run_a_while())
    executor.shutdown()
    assert "stream consumer sync failed unexpectedly" in caplog.text
    assert consumers.position(S, U, "C") == 1  # applied by the second, restarted try
