"""AsyncEngine: group commit from asyncio, listener order, and never blocking the loop on a
database lock held by another writer."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from pathlib import Path

import pytest

from tests.support.server_helpers import async_engine
from tests.support.waiting import run
from tidings.errors import StoreError
from tidings.events.model import EventId, NewEvent, StoredEvent, encode_type
from tidings.events.validation import MAX_OUTBOX_ID_BYTES, MAX_TYPE_TEXT
from tidings.server.async_engine import AsyncEngine
from tidings.server.engine import Engine
from tidings.server.store import EventStore


def _event(name: str) -> NewEvent:
    return NewEvent(("t", name))


def test_requests_submitted_together_are_sessions_of_one_group(tmp_path: Path) -> None:
    async def main() -> list[list[StoredEvent | None]]:
        async with async_engine(tmp_path / "events.db") as engine:
            futures = [engine.submit([_event(str(n)), _event("x")]) for n in range(50)]
            return list(await asyncio.gather(*futures))

    results = run(main())
    sessions = [r[0].id.session for r in results if r[0] is not None]
    assert sessions == sorted(sessions) and len(set(sessions)) == 50
    instances = [e.id.instance for r in results for e in r if e is not None]
    assert instances == list(range(instances[0], instances[0] + 100))


def test_a_group_written_in_the_thread_reaches_the_loop_in_few_wake_ups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """500 one-event sessions written by the write thread (too many events for the loop)
    while the loop is busy: they cross to the loop in one wake-up, not one per session, and
    listeners hear each session as its own batch, in storage order. (The loop's
    call_soon_threadsafe is wrapped to count the write thread's wake-ups: a spy, the writes
    are real. Other threads' are not counted: the change feed's poll for outside writes, say,
    whose turn may come while the group is answered.)

    The loop is kept busy until the thread has stored the whole group, so that the count
    is the design's, not the scheduler's: a batch wakes the loop only if no wake-up is still
    pending, and how often a free loop takes the waiting batches between two sessions
    depends on when it gets the GIL (2-3 times on a quiet machine, 289 with the cores busy).
    """
    store = EventStore(f"sqlite:///{tmp_path / 'events.db'}")
    core = Engine(store, [])

    async def main() -> tuple[list[list[int]], int]:
        loop = asyncio.get_running_loop()
        wake_ups = 0
        call_soon_threadsafe = loop.call_soon_threadsafe

        def counted(*args: object, **kwargs: object) -> asyncio.Handle:
            nonlocal wake_ups
            if threading.current_thread().name.startswith("tidings-register"):
                wake_ups += 1
            return call_soon_threadsafe(*args, **kwargs)  # type: ignore[arg-type]

        engine = AsyncEngine(core)
        try:
            # After the engine's own callback (the change feed's): the group has crossed
            # once the last session is counted.
            stored: list[int] = []
            all_stored = threading.Event()

            def count(events: list[StoredEvent]) -> None:
                stored.append(len(events))
                if len(stored) == 500:
                    all_stored.set()

            core.on_registered(count)
            heard: list[list[int]] = []
            engine.subscribe(lambda events: heard.append([e.position for e in events]))
            monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
            futures = [engine.submit([_event(str(n))], more_coming=True) for n in range(500)]
            await asyncio.sleep(0)  # the write queue's turn: it hands the group to the thread
            # The loop is busy (blocked here) while the thread stores the group.
            assert all_stored.wait(timeout=20), f"the thread stored {len(stored)} of 500"
            await asyncio.gather(*futures)
            monkeypatch.undo()
        finally:
            await engine.aclose()
        return heard, wake_ups

    try:
        heard, wake_ups = run(main())
    finally:
        store.close()
    assert [len(batch) for batch in heard] == [1] * 500
    positions = [batch[0] for batch in heard]
    assert positions == list(range(positions[0], positions[0] + 500))
    # One wake-up carries the 500 sessions across, one the group's completion.
    assert wake_ups == 2, wake_ups


def test_listeners_hear_synced_and_local_batches_in_storage_order(tmp_path: Path) -> None:
    async def main() -> list[int]:
        async with async_engine(tmp_path / "events.db") as engine:
            heard: list[int] = []
            engine.subscribe(lambda events: heard.extend(e.position for e in events))
            peer_event = StoredEvent(0, EventId(2, 1, 1), ("p",), 1, None, None, None, None)
            synced = asyncio.ensure_future(engine.register_synced([peer_event]))
            local = engine.submit([_event("local")])
            await asyncio.gather(synced, local)
        return heard

    heard = run(main())
    assert heard == sorted(heard) and len(heard) == 2


def test_a_lock_held_by_another_writer_never_blocks_the_event_loop(tmp_path: Path) -> None:
    """A small group would be written on the loop; with the database locked elsewhere it
    goes to the write thread instead, and the loop keeps running meanwhile. (The lock is
    released once the loop has shown it runs: the write then goes through.)"""
    path = tmp_path / "events.db"
    store = EventStore(f"sqlite:///{path}")
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    locker.execute("BEGIN IMMEDIATE")

    async def main() -> tuple[float, bool, list[StoredEvent | None]]:
        engine = AsyncEngine(Engine(store, []))
        try:
            register = engine.submit([_event("waits")])
            loop = asyncio.get_running_loop()
            started = loop.time()
            await asyncio.sleep(0.1)
            slept = loop.time() - started
            waiting = not register.done()
            locker.execute("COMMIT")
            return slept, waiting, await register
        finally:
            await engine.aclose()

    try:
        slept, waiting, [stored] = run(main())
    finally:
        locker.close()
        store.close()
    assert slept < 1.0, f"the loop was blocked for {slept:.2f} s"
    assert waiting, "the registration did not wait for the lock"
    assert stored is not None and stored.type == ("t", "waits")


def test_a_busy_store_runs_a_session_through_its_checks_once_per_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A registration tried on the loop that finds the database locked elsewhere goes to
    the write thread without another try on the loop: its refused event is logged twice
    (the loop's try, the thread's write), not three times, and the others are stored."""
    path = tmp_path / "events.db"
    store = EventStore(f"sqlite:///{path}")
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    locker.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, locker.execute, ("COMMIT",))

    async def main() -> list[StoredEvent | None]:
        engine = AsyncEngine(Engine(store, []))
        try:
            release.start()
            return await engine.register([_event("ok"), NewEvent(("bad", "*"))])
        finally:
            await engine.aclose()

    try:
        with caplog.at_level(logging.WARNING, logger="tidings.server.engine"):
            stored = run(main())
    finally:
        release.join()
        locker.close()
        store.close()
    assert [None if e is None else e.type for e in stored] == [("t", "ok"), None]
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 2, [r.getMessage() for r in refused]


def test_a_type_or_outbox_id_too_long_to_index_fails_alone(database_url: str) -> None:
    """Registrations grouped in one transaction: one with a 9,000-character type, one with a
    9,000-byte outbox id. PostgreSQL cannot index either (an index entry is at most 2,704
    bytes), which failed the transaction and so every registration of the group; they are
    refused alone now, on both backends alike."""
    long_type = NewEvent(("t", "x" * 9_000))
    long_outbox_id = NewEvent(("t", "o"), outbox_event_id="o" * 9_000)

    async def main() -> list[list[StoredEvent | None]]:
        store = EventStore(database_url)
        engine = AsyncEngine(Engine(store, []))
        try:
            sessions = [
                [NewEvent(("t", "before"))],
                [long_type],
                [NewEvent(("t", "beside")), long_outbox_id],
                [NewEvent(("t", "after"))],
            ]
            futures = [engine.submit(events, more_coming=True) for events in sessions]
            return list(await asyncio.gather(*futures))
        finally:
            await engine.aclose()
            store.close()

    before, too_long, beside, after = run(main())
    assert [e is not None and e.type for e in before + after] == [("t", "before"), ("t", "after")]
    assert too_long == [None]
    assert beside[0] is not None and beside[0].type == ("t", "beside") and beside[1] is None


def test_the_longest_type_and_outbox_id_allowed_are_stored(database_url: str) -> None:
    """At the bounds, both together (the outbox key indexes them together); one more is
    refused with the reason."""
    segment = "é" * ((MAX_TYPE_TEXT - 8) // 6)  # ["t","..."] is 8, and each é is 6: \u00e9
    at_bound = NewEvent(("t", segment), outbox_event_id="ü" * (MAX_OUTBOX_ID_BYTES // 2))
    assert MAX_TYPE_TEXT - 6 < len(encode_type(at_bound.type)) <= MAX_TYPE_TEXT
    store = EventStore(database_url)
    try:
        [stored] = store.register([at_bound])
        assert (stored.type, stored.outbox_event_id) == (at_bound.type, at_bound.outbox_event_id)
        with pytest.raises(StoreError, match="is too long: over 2000 characters as stored"):
            store.register([NewEvent(("t", segment + "é"))])
        with pytest.raises(StoreError, match=r"outbox_event_id .* is over 500 bytes"):
            store.register([NewEvent(("t",), outbox_event_id="ü" * 251)])
    finally:
        store.close()
