"""The chain's guarantee, end to end, with every part killed: nothing lost, duplicated where
it must not be, or reordered, from the producers' commits to the readers.

Producers commit on PostgreSQL from several threads, out of order (each transaction sleeps a
random while after it has taken its sequence numbers), and roll a share of their transactions
back. The relay (``tidings relay``, real Spark) feeds an event server (``tidings server``)
through its ``event_server`` target; the server serves an FTN18 stream to a pushed and a
polling reliable consumer (``tidings consume``, writing JSON lines) and an intermediary
(``tidings intermediary serve``) serves a SQL view over the table the producers write. While
they run, each process (relay, server, intermediary, both consumers) is SIGKILLed, as a crash
would, and started again.

Asserted against what was committed (the outbox rows and the domain table):

- the store holds each committed event once, per key in commit (sequence) order, and nothing
  of a rolled-back transaction;
- each reliable consumer got every committed event at least once, per key in order of first
  delivery, and nothing else;
- the intermediary's view converges to the source rows;
- every outbox row is PUBLISHED.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select, text

from bench.harness.processes import free_port, kill_tree, local_address, wait_for_port
from tests.support.waiting import wait_until
from tidings.config.passwords import hash_password
from tidings.db import make_engine
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.views.rows import emit_row
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.server.store import EventStore

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.sockets]

TIDINGS = [sys.executable, "-m", "tidings.cli"]
PREFIX = "chain"
KEYS = 12
VIEW = "SELECT id, n FROM item ORDER BY id"
SELECT_N = "SELECT n FROM item WHERE id = :id"
UPSERT = "INSERT INTO item (id, n) VALUES (:id, 1) ON CONFLICT (id) DO UPDATE SET n = item.n + 1"
USER, PASSWORD = "app", "pw"
WAIT = 240.0


class Part:
    """A ``tidings`` command in its own process group, logging to a file; killed with its
    whole group (the relay's JVM too) and started again on the same files."""

    def __init__(self, name: str, args: list[str], work: Path, env: dict[str, str] | None = None):
        self.name = name
        self.args = args
        self.work = work
        self.env = os.environ | {"PYTHONUNBUFFERED": "1"} | (env or {})
        self.log = work / f"{name}.log"
        self.out = work / f"{name}.out"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log, self.out.open("ab") as out:
            self.proc = subprocess.Popen(
                [*TIDINGS, *self.args],
                stdout=out,
                stderr=log,
                env=self.env,
                cwd=self.work,
                start_new_session=True,
            )

    def kill(self) -> None:
        assert self.proc is not None
        kill_tree(self.proc)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_tree(self.proc)

    def lines(self) -> list[dict[str, Any]]:
        """The JSON lines it printed (a consumer's events), a torn last line left out."""
        found = []
        for line in self.out.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found


class Producers:
    """Threads committing out of order on PostgreSQL, some transactions rolled back, until
    :attr:`stop` is set."""

    def __init__(self, outbox: Outbox, threads: int = 4) -> None:
        self.outbox = outbox
        self.threads = threads
        self.rolled_back: list[str] = []
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self._workers = [threading.Thread(target=self._work, args=(n,)) for n in range(threads)]

    def start(self) -> None:
        for worker in self._workers:
            worker.start()

    def join(self) -> None:
        self.stop.set()
        for worker in self._workers:
            worker.join(60)

    def _work(self, seed: int) -> None:
        rng = random.Random(seed)
        i = 0
        while not self.stop.is_set():
            i += 1
            key = rng.randrange(KEYS)
            fail = rng.random() < 0.1
            emitted: list[str] = []
            try:
                with self.outbox.transaction() as tx:
                    conn = tx.connection
                    conn.execute(text(UPSERT), {"id": key})
                    n = conn.execute(text(SELECT_N), {"id": key}).scalar()
                    data = {"key": key, "n": n, "by": seed, "i": i}
                    emitted.append(tx.emit("Counted", data, partition_key=f"k{key}"))
                    emitted.append(emit_row(tx, "item", key, {"id": key, "n": n}))
                    time.sleep(rng.random() * 0.02)  # commits land out of sequence order
                    if fail:
                        raise RuntimeError("rolled back on purpose")
            except RuntimeError:
                with self._lock:
                    self.rolled_back.extend(emitted)
            time.sleep(0.05 + rng.random() * 0.05)


def _files(work: Path, pg: str, ports: dict[str, int]) -> Path:
    eventer = local_address(ports["eventer"])
    data = {
        "database": {"url": pg},
        "outbox": {"originator": "chain-test"},
        "targets": {
            "server": {"kind": "event_server", "address": eventer, "type_prefix": [PREFIX]}
        },
        "routing": {"routes": {"Counted": ["server"], "rows.item": ["server"]}},
        "relay": {"checkpoint_dir": str(work / "checkpoint"), "trigger_interval": "100ms"},
        "servers": {
            "main": {
                "backend": {"module": "tidings.server.backends.sqlite", "db_path": "events.db"},
                "engine": {"server_id": 1},
                "eventer_server": {"address": eventer},
                "stream_users": {USER: {"password_hash": hash_password(PASSWORD)}},
                "streams": [
                    {
                        "name": "chain",
                        "port": ports["stream"],
                        "path": "/chain",
                        "types": {"COUNTED": [PREFIX, "Counted"]},
                    }
                ],
            }
        },
        "intermediaries": {
            "live": {
                "listen": f"127.0.0.1:{ports['live']}",
                "event_server": eventer,
                "row_type_prefix": [PREFIX],
                "tables": {
                    "item": {"columns": {"id": "integer", "n": "integer"}, "keyed_by": "id"}
                },
            }
        },
    }
    path = work / "tidings.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _per_key_in_order(ids: list[str], order: dict[str, int], key_of: dict[str, str]) -> bool:
    """Whether ``ids`` (first occurrences) come, per key, in increasing ``order``."""
    last: dict[str, int] = {}
    for event_id in ids:
        key = key_of[event_id]
        if order[event_id] < last.get(key, -1):
            return False
        last[key] = order[event_id]
    return True


def _first(ids: list[str]) -> list[str]:
    seen: set[str] = set()
    return [i for i in ids if not (i in seen or seen.add(i))]  # type: ignore[func-returns-value]


def test_every_committed_event_reaches_every_reader_across_kills(
    pg_url: str, tmp_path: Path
) -> None:
    ports = {"eventer": free_port(), "stream": free_port(), "live": free_port()}
    path = _files(tmp_path, pg_url, ports)
    engine = make_engine(pg_url)
    outbox = Outbox(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE item (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
    stream_url = f"http://127.0.0.1:{ports['stream']}/chain"
    credentials = {"TIDINGS_STREAM_USER": USER, "TIDINGS_STREAM_PASSWORD": PASSWORD}
    server = Part("server", ["server", "-c", str(path), "--name", "main"], tmp_path)
    relay = Part("relay", ["relay", "-c", str(path)], tmp_path)
    live = Part(
        "intermediary", ["intermediary", "serve", "-c", str(path), "--name", "live"], tmp_path
    )
    pushed = Part("pushed", ["consume", stream_url, "Pushed"], tmp_path, credentials)
    polling = Part("polling", ["consume", stream_url, "Polling", "--poll"], tmp_path, credentials)
    parts = [server, relay, live, pushed, polling]
    producers = Producers(outbox)
    try:
        server.start()
        wait_for_port(ports["eventer"], 60, log=server.log)
        for part in (relay, live, pushed, polling):
            part.start()
        wait_for_port(ports["live"], 60, log=live.log)
        producers.start()
        # Each part dies once while events flow, and comes back.
        for part, pause in (
            (relay, 8.0),
            (server, 3.0),
            (live, 2.0),
            (pushed, 2.0),
            (polling, 2.0),
        ):
            time.sleep(pause)
            part.kill()
            time.sleep(1.0)
            part.start()
            if part is server:
                wait_for_port(ports["eventer"], 60, log=server.log)
        time.sleep(3.0)  # events flow after the last restart too
        producers.join()

        committed = _committed(engine)
        assert len(committed) > 400 and producers.rolled_back  # events flowed through the kills
        order = {event_id: seq for seq, (event_id, _, _) in enumerate(committed)}
        key_of = {event_id: key for event_id, key, _ in committed}
        counted = [event_id for event_id, _, etype in committed if etype == "Counted"]
        wait_until(lambda: _all_published(engine), WAIT, explain=lambda: _tail(relay))
        for consumer in (pushed, polling):
            wait_until(
                lambda c=consumer: set(counted) <= {e["data"]["id"] for e in c.lines()},
                WAIT,
                explain=lambda c=consumer: _tail(c),
            )

        stored_ids = _stored(tmp_path)
        assert sorted(stored_ids) == sorted(order)  # each committed event once, nothing else
        assert not set(stored_ids) & set(producers.rolled_back)
        assert _per_key_in_order(stored_ids, order, key_of)

        for consumer in (pushed, polling):
            got = [e["data"]["id"] for e in consumer.lines()]
            assert set(got) == set(counted), consumer.name  # every one, and nothing else
            assert _per_key_in_order(_first(got), order, key_of), consumer.name

        source = _rows(engine)
        assert asyncio.run(_view_converges(ports["live"], source))
    finally:
        for part in reversed(parts):
            part.stop()
        engine.dispose()


def _committed(engine: Any) -> list[tuple[str, str, str]]:
    """The committed events in sequence order: (event id, partition key, type)."""
    with engine.connect() as conn:
        return [
            (r.event_id, r.partition_key, r.event_type)
            for r in conn.execute(
                select(
                    outbox_event.c.event_id, outbox_event.c.partition_key, outbox_event.c.event_type
                ).order_by(outbox_event.c.seq)
            )
        ]


def _all_published(engine: Any) -> bool:
    with engine.connect() as conn:
        statuses = {r[0] for r in conn.execute(select(outbox_event.c.status).distinct())}
    return statuses == {"PUBLISHED"}


def _rows(engine: Any) -> list[list[int]]:
    with engine.connect() as conn:
        return [list(r) for r in conn.exec_driver_sql(VIEW)]


def _stored(work: Path) -> list[str]:
    """The outbox event ids of the server's events, in the server's (log) order."""
    store = EventStore(f"sqlite:///{work / 'events.db'}")
    try:
        events = store.read(0, limit=10_000_000)
    finally:
        store.close()
    return [e.outbox_event_id for e in events if e.outbox_event_id is not None]


async def _view_converges(port: int, source: list[list[int]]) -> bool:
    """A fresh subscriber's view of the table reaches the source rows (bounded)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            client = await IntermediaryClient.connect(f"ws://127.0.0.1:{port}/")
        except OSError:
            await asyncio.sleep(0.5)
            continue
        try:
            await client.subscribe_sql("v", VIEW, rate_hz=20)
            while time.monotonic() < deadline:
                message = await client.message(WAIT)
                if message.get("op") == "view" and message.get("rows") == source:
                    return True
        finally:
            await client.close()
    return False


def _tail(part: Part) -> str:
    return part.log.read_text()[-3000:]
