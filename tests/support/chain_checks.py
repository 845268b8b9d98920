"""What the whole-chain tests write and check: the producers' transaction (a counted event
and, in half of them, a row event of a counter table), and the checks of what the outbox, the
stores, the consumers and a watching subscriber ended with. Shared by the chain's crash test
and its failover test, which differ in the deployment, not in what they promise."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import Engine, func, select, text

from tidings.config.passwords import hash_password
from tidings.db import make_engine
from tidings.intermediary.views.rows import emit_row
from tidings.outbox.producer import OutboxTransaction
from tidings.outbox.schema import outbox_event
from tidings.server.store import EventStore

#: The type prefix the relay's event_server target gives the chain's events.
PREFIX = "chain"
#: The stream user the consumers log in as.
USER, PASSWORD = "app", "pw"
#: The longest wait for one step (a part's progress, the chain catching up).
WAIT = 120.0
#: How far a part must move events after a test starts watching it before it is killed.
MOVED = 20
#: The counters the producers write to; each is a partition key.
KEYS = 12
#: The intermediary's SQL view over the counter table.
VIEW = "SELECT id, n FROM item ORDER BY id"
#: The domain tables the producers write, created before they start.
DDL = (
    "CREATE TABLE item (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
    "CREATE TABLE tally (key INTEGER NOT NULL, by INTEGER NOT NULL)",
)
_UPSERT = "INSERT INTO item (id, n) VALUES (:id, 1) ON CONFLICT (id) DO UPDATE SET n = item.n + 1"


def write_counted(tx: OutboxTransaction, rng: random.Random, thread: int) -> list[str]:
    """A ``Counted`` event (for the streams) keyed by a counter, with an insert-only domain
    write, so that transactions of one key are ordered by nothing but their sequence numbers;
    and in half of the transactions the counter's row incremented, with its row event (for
    the intermediary; the row's lock orders the increments of one counter)."""
    key = rng.randrange(KEYS)
    conn = tx.connection
    conn.execute(text("INSERT INTO tally (key, by) VALUES (:key, :by)"), {"key": key, "by": thread})
    emitted = [tx.emit("Counted", {"key": key, "by": thread}, partition_key=f"k{key}")]
    if rng.random() < 0.5:
        conn.execute(text(_UPSERT), {"id": key})
        n = conn.execute(text("SELECT n FROM item WHERE id = :id"), {"id": key}).scalar_one()
        emitted.append(emit_row(tx, "item", key, {"id": key, "n": n}))
    return emitted


def committed(engine: Engine) -> dict[str, tuple[str, Any, str]]:
    """The committed events in sequence order: event id -> (partition key, decoded payload,
    type)."""
    columns = (outbox_event.c.event_id, outbox_event.c.partition_key, outbox_event.c.payload)
    with engine.connect() as conn:
        rows = conn.execute(
            select(*columns, outbox_event.c.event_type).order_by(outbox_event.c.seq)
        )
        return {r.event_id: (r.partition_key, json.loads(r.payload), r.event_type) for r in rows}


def published(engine: Engine) -> int:
    """How many outbox rows are PUBLISHED."""
    with engine.connect() as conn:
        return conn.execute(
            select(func.count()).where(outbox_event.c.status == "PUBLISHED")
        ).scalar_one()


def all_published(engine: Engine) -> bool:
    """Whether every outbox row is PUBLISHED."""
    with engine.connect() as conn:
        statuses = {r[0] for r in conn.execute(select(outbox_event.c.status).distinct())}
    return statuses == {"PUBLISHED"}


def source_rows(engine: Engine) -> list[list[int]]:
    """The counter table as the intermediary's view should end up showing it."""
    with engine.connect() as conn:
        return [list(r) for r in conn.exec_driver_sql(VIEW)]


def stored(db_path: Path) -> list[str]:
    """The outbox event ids of an event server's SQLite store, in its log order."""
    store = EventStore(f"sqlite:///{db_path}")
    try:
        events = store.read(0, limit=10_000_000)
    finally:
        store.close()
    return [e.outbox_event_id for e in events if e.outbox_event_id is not None]


def out_of_order(ids: list[str], order: dict[str, int], key_of: dict[str, str]) -> str | None:
    """The first event of ``ids`` that comes after a later-logged one of its key (``order``:
    the log's), said in words; None if there is none."""
    last: dict[str, tuple[int, str]] = {}
    for event_id in ids:
        key, place = key_of[event_id], order[event_id]
        if key in last and place < last[key][0]:
            return f"key {key}: {event_id} (log #{place}) after {last[key][1]} (#{last[key][0]})"
        last[key] = (place, event_id)
    return None


def never_older(views: list[tuple[float, int, list[list[Any]]]]) -> bool:
    """Whether no row of a view (``[id, n]``, ``n`` only ever growing at the source) ever
    showed a smaller ``n`` than an earlier view had shown, across reconnections."""
    shown: dict[int, int] = {}
    for _, _, rows in views:
        for key, n in rows:
            if n < shown.get(key, 0):
                return False
            shown[key] = n
    return True


class Outcome:
    """What the outbox committed once the producers stopped, and the checks of what a store
    or a consumer ended with against it."""

    def __init__(self, engine: Engine) -> None:
        self.events = committed(engine)
        #: The events the streams carry (the row events go to the intermediary only).
        self.counted = {
            event_id: row for event_id, row in self.events.items() if row[2] == "Counted"
        }
        self._order = {event_id: n for n, event_id in enumerate(self.events)}  # sequence order
        self._key_of = {event_id: row[0] for event_id, row in self.events.items()}

    def consumed_all(self, lines: list[dict[str, Any]]) -> bool:
        """Whether a consumer's JSON lines hold every counted event."""
        return self.counted.keys() <= {e["data"]["id"] for e in lines}

    def assert_stored(self, db_path: Path) -> None:
        """The store holds each committed event once, per key in sequence order, and nothing
        else."""
        ids = stored(db_path)
        assert sorted(ids) == sorted(self.events), db_path.name
        assert out_of_order(ids, self._order, self._key_of) is None, db_path.name

    def assert_consumed(self, name: str, lines: list[dict[str, Any]]) -> None:
        """A consumer got every counted event at least once, as committed, per key in order
        of first delivery, and nothing else."""
        assert {e["data"]["id"] for e in lines} == self.counted.keys(), name
        assert all(e["data"] == self.counted[e["data"]["id"]][1] for e in lines), name
        first = list(dict.fromkeys(e["data"]["id"] for e in lines))
        assert out_of_order(first, self._order, self._key_of) is None, name


def chain_server(
    server_id: int, db_path: str, eventer: str, stream_port: int, **more: Any
) -> dict[str, Any]:
    """An event server of the chain on SQLite, serving :func:`chain_stream` on
    ``stream_port`` to :data:`USER` (``more``: further sections, e.g. its Syncer)."""
    return {
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": db_path},
        "engine": {"server_id": server_id},
        "eventer_server": {"address": eventer},
        "stream_users": {USER: {"password_hash": hash_password(PASSWORD)}},
        "streams": [chain_stream(stream_port)],
        **more,
    }


def chain_stream(port: int) -> dict[str, Any]:
    """The FTN18 stream of ``Counted`` events the chain tests' consumers read."""
    return {
        "name": "chain",
        "port": port,
        "path": "/chain",
        "types": {"COUNTED": [PREFIX, "Counted"]},
    }


def counter_view_intermediary(port: int, event_server: str | list[str]) -> dict[str, Any]:
    """The intermediary serving the counter table from its row events."""
    return {
        "listen": f"127.0.0.1:{port}",
        "event_server": event_server,
        "row_type_prefix": [PREFIX],
        "tables": {"item": {"columns": {"id": "integer", "n": "integer"}, "keyed_by": "id"}},
    }


def chain_file(
    work: Path, pg_url: str, target: dict[str, Any], servers: dict[str, Any], live: dict[str, Any]
) -> str:
    """The deployment's ``tidings.yaml`` in ``work``: the outbox on ``pg_url``, the relay's
    ``event_server`` target (``target`` gives where it publishes), both event types routed to
    it, the ``servers`` and the intermediary ``live``."""
    data = {
        "database": {"url": pg_url},
        "outbox": {"originator": "chain-test"},
        "targets": {"server": {"kind": "event_server", **target, "type_prefix": [PREFIX]}},
        "routing": {"routes": {"Counted": ["server"], "rows.item": ["server"]}},
        "relay": {"checkpoint_dir": str(work / "checkpoint"), "trigger_interval": "100ms"},
        "servers": servers,
        "intermediaries": {"live": live},
    }
    path = work / "tidings.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def chain_outbox(pg_url: str) -> Engine:
    """The service's database: the producers' domain tables created."""
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        for statement in DDL:
            conn.exec_driver_sql(statement)
    return engine


def stop_all(stoppable: list[Any], engine: Engine) -> None:
    """End a chain test: stop the producers, the watcher and the parts (each has ``stop``),
    in the order given, then close the database's engine."""
    for thing in stoppable:
        thing.stop()
    engine.dispose()
