"""The publisher run directly (no Spark) against real SQLite files: events emitted, read back
as the relay reads them, and what the targets (embedded event stores) ended up holding.

``Refusing`` injects faults: a real target cannot be made to refuse one chosen event.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import Engine, select

from tidings.events.outbox import EventStatus, OutboxEvent
from tidings.events.timeutil import as_utc
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.publishing.outcome import LoggedEvent
from tidings.server.store import EventStore
from tidings.targets.base import Target
from tidings.targets.kinds.event_store import EventStoreTarget, EventStoreTargetConfig


class Refusing(Target):
    """Fault injection: refuses the events whose payload mentions a chosen word."""

    def __init__(self, name: str, inner: Target, word: str) -> None:
        super().__init__(name)
        self.inner, self.word, self.calls = inner, word, []

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        self.calls.append([e.seq for e in events])
        ok = [e for e in events if self.word not in e.payload]
        results = dict(zip([e.seq for e in ok], self.inner.publish(ok), strict=True))
        return [results.get(e.seq, f"refused {e.seq}") for e in events]


def logged_rows(engine: Engine) -> list[LoggedEvent]:
    with engine.connect() as conn:
        rows = conn.execute(select(outbox_event).order_by(outbox_event.c.seq)).all()
    return [
        LoggedEvent(
            OutboxEvent(
                r.seq,
                r.event_id,
                r.event_type,
                r.payload,
                as_utc(r.logged_at),
                partition_key=r.partition_key,
            ),
            EventStatus(r.status),
            r.retry_count,
            json.loads(r.deliveries) if r.deliveries else {},
        )
        for r in rows
    ]


def rows_by_seq(engine: Engine) -> dict[int, object]:
    with engine.connect() as conn:
        return {r.seq: r for r in conn.execute(select(outbox_event))}


def local_store(tmp_path: Path, name: str) -> EventStoreTarget:
    url = f"sqlite:///{tmp_path / (name + '.db')}"
    return EventStoreTarget(
        name, EventStoreTargetConfig(kind="event_store", url=url, type_prefix=[name])
    )


def emit_all(engine: Engine, events: list[tuple[str, str | None, dict]]) -> None:
    outbox = Outbox(engine)
    for event_type, key, payload in events:
        with outbox.transaction() as tx:
            tx.emit(event_type, payload, partition_key=key)


def stored_seqs(target: Target, engine: Engine) -> list[int]:
    """The log seqs of what the store named like ``target`` holds, in store order."""
    by_id = {r.event_id: r.seq for r in rows_by_seq(engine).values()}
    db = Path(engine.url.database).parent / f"{target.name}.db"
    store = EventStore(f"sqlite:///{db}")
    try:
        return [by_id[e.outbox_event_id] for e in store.read(0, 100_000)]
    finally:
        store.close()


class SteppedClock:
    """A wall clock that moves only when slept on: a run's pauses, recorded, take no time."""

    def __init__(self) -> None:
        self.now = time.time()
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 3))
        self.now += seconds
