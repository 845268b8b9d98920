"""What the whole-chain tests write and check: the producers' transaction (a counted event
and, in half of them, a row event of a counter table), and the checks of what the outbox, the
stores, the consumers and a watching subscriber ended with. Shared by the chain's crash test
and its failover test, which differ in the deployment, not in what they promise."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select, text

from tidings.intermediary.views.rows import emit_row
from tidings.outbox.producer import OutboxTransaction
from tidings.outbox.schema import outbox_event
from tidings.server.store import EventStore

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
