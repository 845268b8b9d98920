"""``durability: periodic``: registrations answered before their commit, committed at most
``flush_period`` later; who sees them before the commit; what a crash takes.

The stores are a real SQLite file and a real PostgreSQL database; "committed" is what a
second, independent connection sees. The crash test SIGKILLs a real ``tidings server``
process under load, with a real Syncer peer process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bench.harness.processes import ServerProcess, free_port, local_address
from tests.support.waiting import run, until, wait_until
from tidings import client
from tidings.config.server import load_server_config
from tidings.db import driver_url
from tidings.errors import ConfigError, StoreError
from tidings.events.model import EventId, NewEvent, PayloadKind, StoredEvent
from tidings.events.query import QueryData
from tidings.server.async_engine import AsyncEngine
from tidings.server.engine import Engine
from tidings.server.store import EventStore, planning
from tidings.server.store.driver import DriverCursor
from tidings.server.store.driver import Writer as StoreWriter


def _committed_count(url: str) -> int:
    """Events a separate connection sees in the store: the committed ones."""
    other = create_engine(driver_url(url))
    try:
        with other.connect() as connection:
            return connection.execute(text("SELECT count(*) FROM event_events")).scalar_one()
    finally:
        other.dispose()


@contextlib.asynccontextmanager
async def held_engine(url: str, flush_period: float) -> AsyncIterator[AsyncEngine]:
    """An engine whose registrations are held up to ``flush_period`` s between commits."""
    store = EventStore(url)
    engine = AsyncEngine(Engine(store, []), flush_period=flush_period)
    try:
        yield engine
    finally:
        await engine.aclose()
        store.close()


def test_periodic_answers_before_the_commit_and_commits_within_the_period(
    database_url: str,
) -> None:
    async def main() -> None:
        async with held_engine(database_url, 0.5) as engine:
            early: list[int] = []
            durable: list[int] = []
            engine.subscribe(lambda events: early.extend(e.id.instance for e in events), early=True)
            engine.subscribe(lambda events: durable.extend(e.id.instance for e in events))
            await engine.write(engine.engine.start)
            await engine.flush()
            before = _committed_count(database_url)
            heard_before = len(durable)
            stored = await engine.register([NewEvent(("t", "a")), NewEvent(("t", "b"))])
            assert all(event is not None for event in stored)
            mine = [event.id.instance for event in stored if event is not None]
            # Answered and told to early listeners, not committed, not told to the others.
            assert early[-2:] == mine
            assert _committed_count(database_url) == before
            assert len(durable) == heard_before
            # Committed by the flush timer, without any read asking for it (how soon is the
            # timer's business; the wait is only bounded).
            await until(lambda: _committed_count(database_url) == before + 2, 5)
            await until(lambda: durable[-2:] == mine, 2)

    run(main())


def test_a_read_sees_every_answered_registration(database_url: str) -> None:
    """A query commits what is held first (the flush period is long here)."""

    async def main() -> list[StoredEvent]:
        async with held_engine(database_url, 30) as engine:
            await engine.register([NewEvent(("t", "x"))])
            assert _committed_count(database_url) == 0
            found = await engine.read(engine.store.read)
            assert _committed_count(database_url) == 1
            return found

    assert [event.type for event in run(main())] == [("t", "x")]


def test_a_committed_read_does_not_commit(database_url: str) -> None:
    """The server's own polling for outside writers reads only what is committed and
    leaves the held registrations alone."""

    async def main() -> None:
        async with held_engine(database_url, 30) as engine:
            await engine.register([NewEvent(("t", "x"))])
            assert await engine.read(engine.store.read, committed=True) == []
            assert _committed_count(database_url) == 0

    run(main())


def test_synced_events_commit_the_held_ones_first_and_keep_the_order(database_url: str) -> None:
    """A peer's events are stored in a transaction of their own: what is held is committed
    before it (waiting for our own held lock would stall the server), and every listener
    hears of both in storage order."""

    async def main() -> tuple[list[int], int]:
        async with held_engine(database_url, 30) as engine:
            heard: list[int] = []
            engine.subscribe(lambda events: heard.extend(e.position for e in events))
            await engine.register([NewEvent(("t", "local"))])
            peer = StoredEvent(0, EventId(2, 1, 1), ("p",), 1, None, None, None, None)
            await engine.register_synced([peer])
            return heard, _committed_count(database_url)

    heard, committed = run(main())
    assert committed == 2
    assert len(heard) == 2 and heard == sorted(heard)


def test_a_write_beside_the_log_commits_the_held_registrations_first(database_url: str) -> None:
    """The streams write consumer positions from threads of their own: on SQLite that write
    would wait for the lock the held registrations keep until the next flush."""

    def write_beside(store: EventStore) -> None:
        with store.transaction("write beside the log") as connection:
            connection.execute(text("SELECT 1"))

    async def main() -> None:
        async with held_engine(database_url, 30) as engine:
            await engine.register([NewEvent(("t", "x"))])
            async with asyncio.timeout(5):
                await asyncio.to_thread(write_beside, engine.store)
            assert _committed_count(database_url) == 1

    run(main())


def test_a_commit_beside_the_queue_reaches_the_durable_listeners(database_url: str) -> None:
    """A stream consumer's acknowledgement (or retention) commits the held registrations in
    its own thread: the durable listeners (peers, streams) hear of them then, not at some
    later write (they heard nothing until one came, on a quiet server never)."""

    def write_beside(store: EventStore) -> None:
        with store.transaction("acknowledge") as connection:
            connection.execute(text("SELECT 1"))

    async def main() -> None:
        async with held_engine(database_url, 60) as engine:
            durable: list[int] = []
            engine.subscribe(lambda events: durable.extend(e.position for e in events))
            [stored] = await engine.register([NewEvent(("t", "x"))])
            assert stored is not None and durable == []
            await asyncio.to_thread(write_beside, engine.store)
            await until(lambda: durable == [stored.position], 5)

    run(main())


def test_a_modules_own_session_is_committed_within_the_period(database_url: str) -> None:
    """A module may keep the engine and register sessions of its own from its own thread,
    beside the write queue: the flush clock runs for them too, so they are committed and
    the durable listeners hear of them (they stayed uncommitted, the database locked for
    every other process, until a client's write came by)."""

    async def main() -> None:
        async with held_engine(database_url, 0.2) as engine:
            durable: list[int] = []
            engine.subscribe(lambda events: durable.extend(e.position for e in events))
            [stored] = await asyncio.to_thread(engine.engine.register, [NewEvent(("m", "own"))])
            assert stored is not None
            await until(lambda: _committed_count(database_url) == 1, 5)
            await until(lambda: durable == [stored.position], 5)

    run(main())


def test_durable_listeners_hear_only_what_the_commit_covered(database_url: str) -> None:
    """A write stored right after a commit, before the loop hears of the commit, waits for
    its own (the durable listeners heard of it at once, uncommitted: a peer could hold an
    event its origin then lost in a crash, and the restarted origin gave its id to another
    event)."""

    def commit_then_write(engine: AsyncEngine) -> StoredEvent | None:
        engine.store.flush()
        [later] = engine.engine.register([NewEvent(("m", "later"))])
        return later

    async def main() -> None:
        async with held_engine(database_url, 60) as engine:
            durable: list[int] = []
            engine.subscribe(lambda events: durable.extend(e.position for e in events))
            [first] = await engine.register([NewEvent(("t", "first"))])
            later = await asyncio.to_thread(commit_then_write, engine)
            assert first is not None and later is not None
            await until(lambda: durable == [first.position], 5)
            for _ in range(20):  # the loop's turns after the commit's news
                await asyncio.sleep(0.01)
            assert durable == [first.position]
            assert _committed_count(database_url) == 1
            await engine.flush()
            await until(lambda: durable == [first.position, later.position], 5)

    run(main())


def test_writes_rolled_back_beside_the_loop_are_never_told_to_the_durable_listeners(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread rolls the held transaction back (a database error) right as the loop
    looks whether a new batch may reach the durable listeners. The moment cannot be timed
    with a real fault, so it is injected: the first read of ``store.failed`` after the
    register rolls back, as a thread would right after it. The listeners must not hear of
    the batch (they did when ``failed`` was read before ``unflushed``: the rollback sets the
    one, then clears the other)."""
    real_failed = EventStore.failed
    armed = False

    def failed(store: EventStore) -> str | None:
        nonlocal armed
        value = real_failed.fget(store)  # type: ignore[attr-defined]
        if armed:
            armed = False
            store._writer._rollback()  # what the other thread does right after this read
        return value

    monkeypatch.setattr(EventStore, "failed", property(failed))

    async def main() -> tuple[list[int], list[int]]:
        nonlocal armed
        async with held_engine(database_url, 60) as engine:
            early: list[int] = []
            durable: list[int] = []
            engine.subscribe(lambda events: early.extend(e.position for e in events), early=True)
            engine.subscribe(lambda events: durable.extend(e.position for e in events))
            armed = True
            await engine.register([NewEvent(("t", "lost"))])
            await asyncio.sleep(0.2)
            assert engine.store.failed is not None
            return early, durable

    early, durable = run(main())
    assert early and durable == []
    assert _committed_count(database_url) == 0


def test_held_registrations_are_committed_at_close(database_url: str) -> None:
    async def main() -> None:
        async with held_engine(database_url, 30) as engine:
            for n in range(20):
                await engine.register([NewEvent(("t", str(n)))])
            assert _committed_count(database_url) == 0

    run(main())
    assert _committed_count(database_url) == 20


def test_a_lost_commit_stops_writes_and_is_never_told_to_the_peers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit of held registrations that fails (a full disk, an I/O error; injected here,
    a real SQLite file cannot be made to fail on demand) loses answered sessions without a
    crash: the durable listeners never hear of them, no further write is taken (its ids and
    positions would be the lost ones'), and the server is told to stop."""
    url = f"sqlite:///{tmp_path / 'events.db'}"

    def failing_commit(self: StoreWriter, raw: object) -> None:
        raise sqlite3.OperationalError("disk I/O error (injected)")

    async def main() -> tuple[list[int], str, str]:
        async with held_engine(url, 30) as engine:
            durable: list[int] = []
            engine.subscribe(lambda events: durable.extend(e.position for e in events))
            await engine.register([NewEvent(("t", "lost"))])
            monkeypatch.setattr(StoreWriter, "_commit", failing_commit)
            with pytest.raises(StoreError, match="cannot commit held writes"):
                await engine.flush()
            monkeypatch.undo()
            with pytest.raises(StoreError, match="restart the server"):
                await engine.register([NewEvent(("t", "after"))])
            why = await asyncio.wait_for(engine.wait_broken(), 1)
            return durable, why, engine.store.failed or ""

    durable, why, failed = run(main())
    assert durable == []
    assert "rolled back" in why and why == failed
    assert _committed_count(url) == 0


def test_a_failed_first_write_does_not_keep_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that opens the held transaction and fails (injected) rolls back to its
    savepoint; the transaction it opened is still committed within the flush period, so
    other writers of the file are not locked out on an idle server."""
    path = tmp_path / "events.db"
    url = f"sqlite:///{path}"

    def failing_insert(conn: object, rows: object) -> None:
        raise sqlite3.OperationalError("constraint failed (injected)")

    async def main() -> None:
        async with held_engine(url, 0.2) as engine:
            monkeypatch.setattr(planning, "insert_event_rows", failing_insert)
            with pytest.raises(StoreError):
                await engine.register([NewEvent(("t", "x"))])
            monkeypatch.undo()
            await asyncio.sleep(0.6)
            other = sqlite3.connect(path, timeout=0.5)
            try:
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
            finally:
                other.close()
            assert engine.store.failed is None
            stored = await engine.register([NewEvent(("t", "y"))])
            assert stored[0] is not None

    run(main())


def _committed_counters(url: str) -> dict[str, int]:
    other = create_engine(driver_url(url))
    try:
        with other.connect() as connection:
            rows = connection.execute(text("SELECT name, value FROM event_counters"))
            return {name: value for name, value in rows}
    finally:
        other.dispose()


def test_held_numbering_survives_undone_writes_commits_and_other_writers(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held registrations are numbered in memory while the held transaction holds the
    append lock: a write undone to its savepoint (failure injected) gives its numbers back,
    the commit stores the counters with the events, and after it another writer of the
    database (a second store) may append: the next held transaction numbers after it."""

    def failing_insert(conn: DriverCursor, rows: object) -> None:
        raise conn.error("constraint failed (injected)")  # the database driver's own error

    async def main() -> None:
        async with held_engine(database_url, 30) as engine:
            first = await engine.register([NewEvent(("t", "a"))] * 3)
            monkeypatch.setattr(planning, "insert_event_rows", failing_insert)
            with pytest.raises(StoreError):
                await engine.register([NewEvent(("t", "failed"))])
            monkeypatch.undo()
            second = await engine.register([NewEvent(("t", "b"))])
            assert [e.id.session for e in first + second if e] == [1, 1, 1, 2]
            assert [e.position for e in first + second if e] == [1, 2, 3, 4]
            assert [e.id.instance for e in first + second if e] == [1, 2, 3, 4]
            assert _committed_counters(database_url)["position"] == 0  # nothing written yet
            await engine.flush()
            assert _committed_counters(database_url) == {
                "position": 4,
                "session:1": 2,
                "instance:1": 4,
            }
            other = EventStore(database_url, server_id=2)
            try:
                [outside] = other.register([NewEvent(("t", "other"))])
            finally:
                other.close()
            assert outside.position == 5
            third = await engine.register([NewEvent(("t", "c"))] * 2)
            assert [(e.position, e.id.session, e.id.instance) for e in third if e] == [
                (6, 3, 5),
                (7, 3, 6),
            ]
            stored = await engine.read(engine.store.read, 0, 100)
            assert [e.position for e in stored] == [1, 2, 3, 4, 5, 6, 7]
            assert len({e.id for e in stored}) == 7
            assert _committed_counters(database_url)["position"] == 7

    run(main())


_FAILING_INSERT = {
    "sqlite": "CREATE TRIGGER fail_dead BEFORE INSERT ON event_events WHEN NEW.payload = x'dead' "
    "BEGIN SELECT RAISE(ABORT, 'injected failure'); END",
    "postgresql": "CREATE FUNCTION fail_dead() RETURNS trigger AS $$ BEGIN "
    "IF NEW.payload = '\\xdead'::bytea THEN RAISE EXCEPTION 'injected failure'; END IF; "
    "RETURN NEW; END $$ LANGUAGE plpgsql; CREATE TRIGGER fail_dead BEFORE INSERT ON "
    "event_events FOR EACH ROW EXECUTE FUNCTION fail_dead()",
}


def test_an_undone_held_write_gives_back_only_its_own_numbers(database_url: str) -> None:
    """Two threads register on one store (it is safe to share by threads): the first waits
    for the writer while the second's write is stored, then fails in the database (a
    trigger refuses its payload) and is undone to its savepoint. The numbers it gives back
    are its own: the second's stay taken, and the next register comes after both."""
    store = EventStore(database_url)
    store.hold_writes()
    try:
        backend = store.backend
        engine = create_engine(driver_url(database_url))
        with engine.begin() as connection:
            connection.exec_driver_sql(_FAILING_INSERT[backend])
        engine.dispose()
        store.register([NewEvent(("t", "first"))])
        bad = NewEvent(("t", "bad"), b"\xde\xad", PayloadKind.BINARY)
        outcome: dict[str, object] = {}

        def failing() -> None:
            with pytest.raises(StoreError, match="injected failure"):
                store.register([bad])
            outcome["failing"] = "failed"

        def storing() -> None:
            outcome["stored"] = store.register([NewEvent(("t", "ok"))])[0].position

        writer_lock = store._writer._lock  # only to line the two threads up
        with writer_lock:
            second = threading.Thread(target=storing)
            second.start()
            time.sleep(0.2)  # the second waits for the writer first ...
            first = threading.Thread(target=failing)
            first.start()
            time.sleep(0.2)  # ... then the failing one
        second.join(10)
        first.join(10)
        assert outcome == {"stored": 2, "failing": "failed"}
        [after] = store.register([NewEvent(("t", "after"))])
        assert (after.position, after.id.session, after.id.instance) == (3, 3, 3)
        store.flush()
        assert _committed_counters(database_url) == {
            "position": 3,
            "session:1": 3,
            "instance:1": 3,
        }
    finally:
        store.close()


def test_durability_keys_are_checked() -> None:
    base = {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": "x.db"},
        "engine": {"server_id": 1, "modules": []},
    }
    config = load_server_config(base)
    assert config.backend.held_flush_period is None
    held = {**base["backend"], "durability": "periodic", "flush_period": 0.25}
    assert load_server_config({**base, "backend": held}).backend.held_flush_period == 0.25
    assert "durability" not in load_server_config({**base, "backend": held}).backend.options()
    for bad, key in (
        ({"durability": "sometimes"}, "backend.durability"),
        ({"durability": "periodic", "flush_period": 0}, "backend.flush_period"),
    ):
        with pytest.raises(ConfigError, match=key):
            load_server_config({**base, "backend": {**base["backend"], **bad}})


# --- a crash under load ------------------------------------------------------------------------

FLUSH_PERIOD = 0.5
PARTS = 3  # events per session: a session is stored whole or not at all


class Writer:
    """Registers numbered sessions of PARTS events, one at a time, noting when each was
    answered; stops at the first failure (the server was killed)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.answered: dict[int, float] = {}

    async def run(self) -> None:
        try:
            connection = await client.connect(self.server.eventer, timeout=5)
            n = 0
            while True:
                events = [client.json_event(("load", str(part)), {"n": n}) for part in range(PARTS)]
                results = await asyncio.wait_for(connection.register_with_response(events), 5)
                assert all(result is not None for result in results)
                self.answered[n] = time.monotonic()
                n += 1
        except (OSError, TimeoutError, client.ConnectionClosed):
            return


async def _loads(server: ServerProcess) -> list[StoredEvent]:
    async with await client.connect(server.eventer, timeout=5) as connection:
        return await connection.query(QueryData(event_types=(("load", "*"),)))


@pytest.mark.slow
@pytest.mark.sockets
def test_a_crash_loses_only_whole_sessions_at_the_end_and_the_peer_converges(
    tmp_path: Path,
) -> None:
    ports = {name: {"eventer": free_port(), "syncer": free_port()} for name in "ab"}
    periodic = {
        "module": "tidings.server.backends.sqlite",
        "db_path": "ev.db",
        "durability": "periodic",
        "flush_period": FLUSH_PERIOD,
    }
    a = ServerProcess.tidings(
        tmp_path / "a", 1, ports["a"], [(2, local_address(ports["b"]["syncer"]))], "t", periodic
    )
    b = ServerProcess.tidings(
        tmp_path / "b", 2, ports["b"], [(1, local_address(ports["a"]["syncer"]))], "t"
    )
    try:
        a.start(30)
        b.start(30)
        writer = Writer(a)

        async def load_then_kill() -> float:
            task = asyncio.create_task(writer.run())
            await asyncio.sleep(3)
            a.kill()
            killed = time.monotonic()
            await task
            return killed

        killed = run(load_then_kill(), 30)
        assert len(writer.answered) > 100, "the server took too little load to test"
        a.start(30)

        def numbers(events: list[StoredEvent]) -> dict[int, set[str]]:
            found: dict[int, set[str]] = {}
            for event in events:
                found.setdefault(json.loads(event.payload)["n"], set()).add(event.type[1])
            return found

        held = numbers(run(_loads(a)))
        # Nothing partial, nothing out of order: whole sessions 0..k, a prefix of the answers.
        assert all(parts == {str(p) for p in range(PARTS)} for parts in held.values())
        assert sorted(held) == list(range(len(held)))
        # Everything answered a flush period (plus a margin for the commit) before the
        # kill is there; what was lost was answered within that time.
        margin = FLUSH_PERIOD + 0.5
        assert {n for n, at in writer.answered.items() if at < killed - margin} <= set(held)
        lost = set(writer.answered) - set(held)
        assert all(writer.answered[n] >= killed - margin for n in lost)
        # The peer held only committed events, and both logs converge.
        events_a = run(_loads(a))
        kept = {(e.id, e.type, e.payload) for e in events_a}

        def peer_copy() -> set[tuple]:
            return {(e.id, e.type, e.payload) for e in run(_loads(b)) if e.id.server == 1}

        wait_until(
            lambda: peer_copy() == kept,
            30,
            interval=0.3,
            explain=lambda: f"only on a: {sorted(kept - peer_copy())[:4]}",
        )

        # The restarted server goes on after what it kept; its new sessions reach the peer.
        async def one_more() -> StoredEvent:
            async with await client.connect(a.eventer, timeout=5) as connection:
                [stored] = await connection.register_with_response(
                    [client.json_event(("load", "after"), {"n": -1})]
                )
            assert stored is not None
            return stored

        after = run(one_more())
        assert after.id.session > max(e.id.session for e in events_a)
        wait_until(lambda: any(e.id == after.id for e in run(_loads(b))), 30)
    finally:
        a.stop()
        b.stop()
