"""``tidings import-hat``: a database a real hat-event 0.8.5 server wrote (lmdb backend) under
its own client's load, imported into SQLite and PostgreSQL stores; interrupted for real
(SIGKILL) and resumed; checked, and the check seen to fail when the store differs."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.harness.processes import local_address
from tests.support.cli_runs import one_error_line, run_tidings
from tests.support.helpers import hat_event_server
from tests.support.waiting import run
from tidings.errors import HatImportError
from tidings.events.model import EventId, NewEvent, PayloadKind
from tidings.server.hat_import import import_hat
from tidings.server.store import EventStore

pytestmark = [pytest.mark.sockets]

HAT_SERVER = 7
#: Register calls per client, events per call, clients at once.
CALLS, PER_CALL, CLIENTS = 40, 50, 3

#: What hat's server answered: id -> (type, timestamp us, source timestamp us, payload).
Expected = dict[EventId, tuple[tuple[str, ...], int, int | None, Any]]


def _us(ts: Any) -> int:
    return int(ts.s) * 1_000_000 + int(ts.us)


def _payload(p: Any) -> Any:
    """A hat payload as (kind, bytes) for comparing with a stored event."""
    import hat.event.common as hat_common
    from hat import json as hat_json

    if p is None:
        return (None, None)
    if p.type == hat_common.EventPayloadType.JSON:
        return (PayloadKind.JSON, hat_json.decode(hat_json.encode(p.data)))
    if p.type == hat_common.EventPayloadType.BINARY:
        return (PayloadKind.BINARY, bytes(p.data))
    return (PayloadKind.SBS, p.data)


async def _load(port: int) -> Expected:
    """Hat clients registering mixed events at once; what the server answered."""
    import hat.event.common as hat_common
    import hat.event.eventer as hat_eventer

    def event(client: int, call: int, i: int) -> Any:
        kind = i % 4
        payload = (
            hat_common.EventPayload(hat_common.EventPayloadType.JSON, {"c": client, "i": i})
            if kind == 0
            else hat_common.EventPayload(hat_common.EventPayloadType.BINARY, bytes([i, client]))
            if kind == 1
            else None
            if kind == 2
            else hat_common.EventPayload(
                hat_common.EventPayloadType.SBS,
                hat_common.SbsData(None, "Integer", (i * 1000).to_bytes(2, "big")),
            )
        )
        return hat_common.RegisterEvent(
            event_type=("load", str(client), str(i % 5)),
            source_timestamp=hat_common.now() if i % 3 else None,
            payload=payload,
        )

    async def one(client: int) -> list[Any]:
        eventer = await hat_eventer.connect(local_address(port))
        try:
            found = []
            for call in range(CALLS):
                found += await eventer.register_with_response(
                    [event(client, call, i) for i in range(PER_CALL)]
                )
            return found
        finally:
            await eventer.async_close()

    results = [e for group in await asyncio.gather(*map(one, range(CLIENTS))) for e in group]
    return {
        EventId(*e.event_id): (
            tuple(e.event_type),
            _us(e.timestamp),
            None if e.source_timestamp is None else _us(e.source_timestamp),
            e.payload,
        )
        for e in results
    }


@pytest.fixture(scope="module")
def hat_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    """The lmdb file of a hat-event 0.8.5 server stopped after its clients' load."""
    workdir = tmp_path_factory.mktemp("hat")
    with hat_event_server(workdir, HAT_SERVER) as (eventer_port, _, process):
        expected = run(_load(eventer_port), 120)
        process.terminate()  # hat flushes its lmdb on the way out
        assert process.wait(30) == 0
    return workdir / "hat-event" / "hat-event.db", expected


def _stored(url: str) -> dict[EventId, Any]:
    store = EventStore(url)
    try:
        events, after = [], 0
        while batch := store.read(after, 5000):
            events += batch
            after = batch[-1].position
    finally:
        store.close()
    return {e.id: e for e in events}


def _assert_all_kept(url: str, expected: Expected) -> None:
    """Every event the hat clients registered is stored with its id, timestamps, type and
    payload; and positions follow the timestamps."""
    stored = _stored(url)
    from hat import sbs

    for event_id, (event_type, ts, source, payload) in expected.items():
        event = stored[event_id]
        assert (event.type, event.timestamp_us, event.source_timestamp_us) == (
            event_type,
            ts,
            source,
        )
        kind, data = _payload(payload)
        assert event.payload_kind is kind
        if kind is PayloadKind.JSON:
            import json

            assert json.loads(event.payload or b"") == data
        elif kind is PayloadKind.SBS:
            from tidings.wire.codec import REPOSITORY

            decoded = REPOSITORY.decode("Hat", "Data", event.payload)
            assert (decoded["module"], decoded["type"], bytes(decoded["data"])) == (
                ("none", None),
                "Integer",
                data.data,
            )
        else:
            assert event.payload == data
    assert sbs  # hat-sbs is what carries the SBS payloads
    ordered = sorted(stored.values(), key=lambda e: e.position)
    assert [e.timestamp_us for e in ordered] == sorted(e.timestamp_us for e in ordered)


def _continues(url: str, server: int) -> None:
    """A store with hat's server id numbers its next session after hat's last."""
    store = EventStore(url, server_id=server)
    try:
        last = store.last_event_id()
        (new,) = store.register([NewEvent(("after", "import"), None, None, None, None)])
    finally:
        store.close()
    assert new.id == EventId(server, last.session + 1, last.instance + 1)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_hat_database_is_imported_whole_and_checked(
    backend: str, hat_db: tuple[Path, Expected], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    path, expected = hat_db
    url = (
        f"sqlite:///{tmp_path / 'store.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    store = EventStore(url)
    seen: list[int] = []
    try:
        report = import_hat(path, store, batch=700, progress=seen.append)
    finally:
        store.close()
    # hat's own engine events (event/engine ...) are in its database too
    assert report.imported >= len(expected)
    assert seen[-1] == report.imported and len(seen) > 1
    assert report.equal, report.differences
    assert report.checked_events == report.imported
    assert set(report.servers) == {HAT_SERVER}
    _assert_all_kept(url, expected)
    _continues(url, HAT_SERVER)

    # again: nothing more, and still equal
    store = EventStore(url)
    try:
        again = import_hat(path, store)
    finally:
        store.close()
    assert (again.imported, again.equal) == (0, True)


def _count(path: Path) -> int:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM event_events").fetchone()[0])
    except sqlite3.OperationalError:  # not made yet
        return 0


@pytest.mark.slow
def test_an_import_killed_midway_resumes_and_finishes_equal(
    hat_db: tuple[Path, Expected], tmp_path: Path
) -> None:
    path, expected = hat_db
    store_path = tmp_path / "store.db"
    url = f"sqlite:///{store_path}"
    command = [sys.executable, "-m", "tidings.cli", "import-hat", str(path), "--url", url]
    proc = subprocess.Popen(
        [*command, "--batch", "20"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while _count(store_path) == 0 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    midway = _count(store_path)
    assert 0 < midway < len(expected)

    done = run_tidings(*command[3:], "--json")
    assert done.returncode == 0, done.stderr
    import json

    report = json.loads(done.stdout)
    assert report["equal"] is True and report["differences"] == []
    assert report["imported"] + midway == report["checked_events"]
    assert "import-hat:" in done.stderr
    _assert_all_kept(url, expected)


def test_the_check_reports_a_store_that_differs(
    hat_db: tuple[Path, Expected], tmp_path: Path
) -> None:
    path, _ = hat_db
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = EventStore(url)
    try:
        assert import_hat(path, store).equal
        # an event lost from the store: before the last imported one, so no run brings it back
        (victim,) = store.read(10, 1)
        store.delete_positions([victim.position])
    finally:
        store.close()
    done = run_tidings("import-hat", str(path), "--url", url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0 events imported" in done.stdout
    assert "counts and latest event per type DIFFERENT" in done.stdout
    assert f"type {list(victim.type)}: " in done.stdout


def test_bad_input_is_one_clear_line(hat_db: tuple[Path, Expected], tmp_path: Path) -> None:
    path, _ = hat_db
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert "no such file" in one_error_line(
        run_tidings("import-hat", str(tmp_path / "missing.db"), "--url", url)
    )
    not_lmdb = tmp_path / "not-lmdb.db"
    not_lmdb.write_bytes(b"hello" * 1000)
    assert "hat-event lmdb database" in one_error_line(
        run_tidings("import-hat", str(not_lmdb), "--url", url)
    )
    assert "not a file" in one_error_line(run_tidings("import-hat", str(tmp_path), "--url", url))
    assert "--conf SERVER_FILE or --url" in one_error_line(run_tidings("import-hat", str(path)))
    with pytest.raises(HatImportError, match="no such file"):
        import_hat(tmp_path / "missing.db", EventStore(url))


def test_events_of_several_servers_merge_by_time_and_a_partly_filled_store_is_completed(
    tmp_path: Path,
) -> None:
    """A database holding two servers' events (written by hat's own lmdb backend, as its
    Syncer stores a peer's), into a store that a Syncer had already given some of one
    server's events: the rest comes, in time order across the servers, once each."""
    import hat.event.common as hat_common
    import hat.event.server.backends.lmdb as hat_lmdb

    path = tmp_path / "two.db"
    base = int(time.time()) - 100

    def hat_event(server: int, n: int) -> Any:
        return hat_common.Event(
            event_id=hat_common.EventId(server, n + 1, n + 1),
            event_type=("s", str(server)),
            timestamp=hat_common.Timestamp(base + 2 * n + (server == 4), 0),
            source_timestamp=None,
            payload=hat_common.EventPayload(hat_common.EventPayloadType.JSON, n),
        )

    async def write() -> None:
        backend = await hat_lmdb.create(
            {
                "db_path": str(path),
                "max_db_size": 2**26,
                "flush_period": 60,
                "conditions": [],
                "latest": {"subscriptions": [["*"]]},
                "ordered": [{"order_by": "TIMESTAMP", "subscriptions": [["*"]]}],
            }
        )
        await backend.register([hat_event(server, n) for server in (3, 4) for n in range(10)])
        await backend.flush()
        await backend.async_close()

    run(write())
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = EventStore(url)
    try:
        from tidings.server.hat_lmdb import HatLmdb

        with HatLmdb(path) as source:
            first = list(source.events(3, EventId(3, 0, 0)))[:4]
        store.append_synced(first)  # a Syncer brought server 3's first four
        report = import_hat(path, store, batch=3)
        events = store.read(0, 100)
        assert store.last_event_id(3) == EventId(3, 10, 10)
        assert store.last_event_id(4) == EventId(4, 10, 10)
    finally:
        store.close()
    assert (report.imported, report.equal, report.checked_events) == (16, True, 20)
    imported = events[4:]
    assert [(e.id.server, e.id.session) for e in imported] == [
        (4, 1), (4, 2), (4, 3), (4, 4),
        *[(server, n) for n in range(5, 11) for server in (3, 4)],
    ]  # fmt: skip
    assert sorted(e.id for e in events) == sorted(
        {EventId(s, n, n) for s in (3, 4) for n in range(1, 11)}
    )


#: Another process (as a running hat server would) adds events to a hat lmdb database with
#: hat's own backend: python -c WRITE PATH SERVER FIRST COUNT BASE_S.
_HAT_WRITES = """
import asyncio, sys
import hat.event.common as c
import hat.event.server.backends.lmdb as lmdb

path, server, first, count, base = sys.argv[1], *map(int, sys.argv[2:])

async def main():
    backend = await lmdb.create({
        "db_path": path, "max_db_size": 2**26, "flush_period": 60, "conditions": [],
        "latest": {"subscriptions": [["*"]]},
        "ordered": [{"order_by": "TIMESTAMP", "subscriptions": [["*"]]}],
    })
    await backend.register([
        c.Event(c.EventId(server, n, n), ("s", str(server)), c.Timestamp(base + n, 0), None,
                c.EventPayload(c.EventPayloadType.JSON, n))
        for n in range(first, first + count)
    ])
    await backend.flush()
    await backend.async_close()

asyncio.run(main())
"""


def _hat_writes(path: Path, server: int, first: int, count: int, base: int) -> None:
    subprocess.run(
        [sys.executable, "-c", _HAT_WRITES, str(path), *map(str, (server, first, count, base))],
        check=True,
        timeout=60,
    )


def test_the_check_reads_the_snapshot_the_import_read(tmp_path: Path) -> None:
    """hat keeps writing while the import runs: the check compares what was imported, not
    a later state of the database (which the next run imports)."""
    path, base = tmp_path / "live.db", int(time.time()) - 100
    _hat_writes(path, 3, 1, 10, base)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    added: list[int] = []

    def hat_goes_on(imported: int) -> None:
        if not added:  # after the first batch, hat registers five more (and flushes them)
            added.append(imported)
            _hat_writes(path, 3, 11, 5, base)

    store = EventStore(url)
    try:
        first = import_hat(path, store, batch=3, progress=hat_goes_on)
        assert added, "the import stored no batch"
        assert (first.imported, first.checked_events, first.differences) == (10, 10, [])
        second = import_hat(path, store)
        assert (second.imported, second.checked_events, second.equal) == (5, 15, True)
        assert store.last_event_id(3) == EventId(3, 15, 15)
    finally:
        store.close()


def test_an_lmdb_of_hat_tables_with_other_records_is_one_clear_line(tmp_path: Path) -> None:
    """Another program's lmdb with hat's table names (another hat version, a damaged file):
    hat's decoders raise whatever the bytes make them; the command says which record."""
    import hat.event.common as hat_common
    from hat.event.server.backends.lmdb import common, encoder

    foreign = tmp_path / "foreign.db"
    env = common.ext_create_env(foreign)
    dbs = {t: common.ext_open_db(env, t) for t in common.DbType}
    with env.begin(write=True) as txn:
        txn.put(b"\x00\x01", b"\x01\x02\x03", db=dbs[common.DbType.SYSTEM])
    env.close()
    damaged = tmp_path / "damaged.db"
    _hat_writes(damaged, 3, 1, 4, int(time.time()) - 100)
    env = common.ext_create_env(damaged)
    ref = common.ext_open_db(env, common.DbType.REF)
    with env.begin(write=True) as txn:
        key = encoder.encode_ref_db_key(hat_common.EventId(3, 2, 2))
        txn.put(key, b"\x07" * 5, db=ref)  # event 3/2/2's references overwritten
    env.close()
    url = f"sqlite:///{tmp_path / 'store.db'}"
    line = one_error_line(run_tidings("import-hat", str(foreign), "--url", url))
    assert "the SYSTEM record" in line and "not a hat-event 0.8.5 database" in line
    line = one_error_line(run_tidings("import-hat", str(damaged), "--url", url))
    assert "the REF record" in line and "or a damaged one" in line


def test_the_server_file_names_the_store(hat_db: tuple[Path, Expected], tmp_path: Path) -> None:
    path, expected = hat_db
    conf = tmp_path / "event.yaml"
    conf.write_text(
        "type: event\n"
        "backend: {module: tidings.server.backends.sqlite, db_path: data/events.db}\n"
        f"engine: {{server_id: {HAT_SERVER}, modules: []}}\n"
        "eventer_server: {address: 'tcp+sbs://127.0.0.1:0'}\n"
    )
    done = run_tidings("import-hat", str(path), "--conf", str(conf))
    assert done.returncode == 0, done.stderr
    assert f"numbering continues: server {HAT_SERVER} after " in done.stdout
    assert "counts and latest event per type equal" in done.stdout
    url = f"sqlite:///{tmp_path / 'data' / 'events.db'}"
    assert set(expected) <= set(_stored(url))
    _continues(url, HAT_SERVER)


def test_a_running_hat_server_is_imported_then_followed_by_a_syncer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The guide's mixed pair: the database of a hat server that keeps running is imported
    (read from a snapshot), then a tidings Syncer client follows that server from the last
    imported event: what hat registers afterwards arrives, and nothing twice."""
    import hat.event.common as hat_common
    import hat.event.eventer as hat_eventer

    from tests.support.server_helpers import async_engine
    from tests.support.waiting import until
    from tidings.server.syncer.client import SyncerClient

    store_path = tmp_path / "store.db"
    imported: list[EventId] = []

    def register(tag: str) -> Any:
        return [
            hat_common.RegisterEvent(
                ("pair", tag),
                None,
                hat_common.EventPayload(hat_common.EventPayloadType.JSON, i),
            )
            for i in range(20)
        ]

    async def scenario(eventer_port: int, syncer_port: int, db: Path) -> None:
        eventer = await hat_eventer.connect(local_address(eventer_port))
        try:
            before = await eventer.register_with_response(register("before"))
            store = EventStore(f"sqlite:///{store_path}", server_id=2)
            try:
                # lmdb flushes every second: import once the events are in the file
                deadline = time.monotonic() + 15
                while True:
                    report = import_hat(db, store)
                    if report.checked_events >= len(before) or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.3)
            finally:
                store.close()
            assert report.equal and report.imported >= len(before)
            imported.append(report.servers[HAT_SERVER])
            async with async_engine(store_path, server_id=2) as engine:
                client = SyncerClient(local_address(syncer_port), engine, HAT_SERVER, min_delay=0.1)
                await client.start()
                try:
                    await client.wait_synced(15)
                    after = await eventer.register_with_response(register("after"))
                    wanted = {EventId(*e.event_id) for e in [*before, *after]}

                    def arrived() -> set[EventId]:
                        return {e.id for e in engine.store.read(0, 100_000)} & wanted

                    await until(lambda: arrived() == wanted, 15)
                finally:
                    await client.aclose()
        finally:
            await eventer.async_close()

    with (
        caplog.at_level(logging.DEBUG, logger="tidings.server.syncer"),
        hat_event_server(tmp_path, HAT_SERVER) as (eventer_port, syncer_port, _),
    ):
        run(scenario(eventer_port, syncer_port, tmp_path / "hat-event" / "hat-event.db"), 90)
    # the Syncer resumed where the import ended, not from the start
    assert f"asked for events after {imported[0]}" in caplog.text
