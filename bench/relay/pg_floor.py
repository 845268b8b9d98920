"""PostgreSQL's own work for phase 2b's events, measured without the relay: raw psycopg
running the relay's SQL on a backlog, stage by stage, each stage's CPU read from its
backend's ``/proc`` entry (the floor any relay on PostgreSQL meets, as
:func:`bench.relay.breakdown.sqlite_floor` is SQLite's).

``python -m bench.relay.pg_floor [--events N]`` prints the stages' CPU per event.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from bench.harness.cpu import postgres_cpu
from bench.harness.databases import scratch_database
from bench.harness.progress import say
from bench.relay.workload import EVENT_TYPE, fill_backlog
from tidings.db import make_engine
from tidings.outbox.producer import Outbox

#: The stages, in the order a relay task runs them for each chunk.
STAGES = ("read", "open rows before", "store lookup", "store insert", "status update", "commit")
_TICK = os.sysconf("SC_CLK_TCK")
_READ_SQL = (
    "SELECT seq, event_id, event_type, event_version, correlation_id, originator, "
    "partition_key, payload, headers, logged_at, status, retry_count, deliveries "
    "FROM outbox_event WHERE seq > %s AND seq <= %s AND partition_bucket %% %s = %s ORDER BY seq"
)
#: :func:`tidings.pipeline.publishing.publisher.open_rows_before`'s statement.
_OPEN_BEFORE_SQL = (
    "SELECT o.partition_key, o.seq, o.event_type, o.deliveries "
    "FROM unnest(%s::text[], %s::bigint[]) AS j(key, bound) CROSS JOIN LATERAL ("
    "SELECT o.partition_key, o.seq, o.event_type, o.deliveries FROM outbox_event AS o "
    "WHERE o.partition_key = j.key AND o.seq < j.bound "
    "AND o.status IN ('PENDING', 'HELD', 'FAILED') OFFSET 0) AS o"
)
_LOOKUP_IN = 500
#: The store's insert before it used COPY: one array parameter per column.
_UNNEST_SQL = (
    "INSERT INTO event_events (position, server, session, instance, type, timestamp_us, "
    "source_timestamp_us, payload, payload_kind, outbox_event_id) SELECT * FROM unnest("
    "%s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[], %s::text[], %s::bigint[], "
    "%s::bigint[], %s::bytea[], %s::text[], %s::text[])"
)


def backend_cpu(pid: int) -> float:
    """User plus system CPU-s of one process, from ``/proc`` (clock ticks)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


@dataclass
class Floor:
    """CPU-s of the backends per stage, and of the whole server over the run."""

    stages: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    server: float = 0.0
    wall: float = 0.0
    wal_bytes: dict[str, int] = field(default_factory=dict)

    def per_event(self, events: int) -> str:
        parts = ", ".join(f"{k} {v / events * 1e6:.1f} us" for k, v in self.stages.items())
        backends = sum(self.stages.values())
        return (
            f"PostgreSQL's own work per event (raw psycopg, the relay's SQL): {parts}; "
            f"backends {backends / events * 1e6:.1f} us, whole server "
            f"{self.server / events * 1e6:.1f} us ({events / self.server:,.0f} ev/s per core)"
        )


class _Timed:
    """A connection whose statements' backend CPU is added to a stage."""

    def __init__(self, url: str, floor: Floor) -> None:
        self.conn = psycopg.connect(url)
        self.pid = self.conn.info.backend_pid
        self.floor = floor

    def timed(self, stage: str) -> _Stage:
        return _Stage(self, stage)

    def close(self) -> None:
        self.conn.close()


class _Stage:
    def __init__(self, owner: _Timed, stage: str) -> None:
        self.owner, self.stage = owner, stage

    def __enter__(self) -> psycopg.Connection[Any]:
        self.started = backend_cpu(self.owner.pid)
        return self.owner.conn

    def __exit__(self, *exc: object) -> None:
        self.owner.floor.stages[self.stage] += backend_cpu(self.owner.pid) - self.started


def _chunks(app: _Timed, upto: int, index: int, parts: int, chunk: int) -> Iterator[list[Any]]:
    """The slice's rows in chunks, read as the relay reads them (a server-side cursor)."""
    with app.conn.transaction():
        cursor = app.conn.cursor(name=f"slice_{index}")
        with app.timed("read"):
            cursor.execute(_READ_SQL, (0, upto, parts, index))
        while True:
            with app.timed("read"):
                rows = cursor.fetchmany(chunk)
            if not rows:
                break
            yield rows
        cursor.close()


@dataclass(frozen=True)
class Variant:
    """How the measured SQL is written (the experiments beside the relay's own)."""

    copy: bool = True  #: the store's rows by binary COPY (else INSERT ... unnest)
    any_lookup: bool = True  #: the store's look-up by one ``= ANY(array)`` (else IN lists)
    app_ddl: tuple[str, ...] = ()  #: run on the outbox database before the backlog
    store_ddl: tuple[str, ...] = ()  #: run on the store database before the drain


def _store_chunk(
    store: _Timed, rows: list[Any], counters: dict[str, int], variant: Variant
) -> None:
    """What the event store does for one chunk: look its outbox ids up, insert the rows."""
    from tidings.server.store.schema import COPY_EVENT_TYPES, COPY_EVENTS_SQL

    ids = sorted(row[1] for row in rows)
    with store.timed("store lookup") as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (0x746964696E677331,))
        if variant.any_lookup:
            conn.execute(
                "SELECT position, server, session, instance, type, timestamp_us, "
                "source_timestamp_us, payload, payload_kind, outbox_event_id FROM event_events "
                "WHERE outbox_event_id = ANY(%s) ORDER BY position",
                (ids,),
            ).fetchall()
            ids = []
        for first in range(0, len(ids), _LOOKUP_IN):
            part = ids[first : first + _LOOKUP_IN]
            marks = ", ".join(["%s"] * len(part))
            conn.execute(
                "SELECT position, server, session, instance, type, timestamp_us, "
                "source_timestamp_us, payload, payload_kind, outbox_event_id FROM event_events "
                f"WHERE outbox_event_id IN ({marks}) ORDER BY position",
                part,
            ).fetchall()
    now_us = time.time_ns() // 1000
    first_position = counters["position"] + 1
    counters["position"] += len(rows)
    counters["session"] += 1
    columns: list[list[Any]] = [[] for _ in range(10)]
    for offset, row in enumerate(rows):
        counters["instance"] += 1
        values = (
            first_position + offset,
            1,
            counters["session"],
            counters["instance"],
            f'["b","{EVENT_TYPE}"]',
            now_us,
            row[9].timestamp() * 1_000_000 // 1,
            row[7].encode(),
            "json",
            row[1],
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    columns[6] = [int(v) for v in columns[6]]
    with store.timed("store insert") as conn:
        conn.execute(
            "UPDATE event_counters SET value = value + CASE name WHEN 'position' THEN %s "
            "WHEN 'session:1' THEN 1 WHEN 'instance:1' THEN %s END "
            "WHERE name IN ('position', 'session:1', 'instance:1') RETURNING name, value",
            (len(rows), len(rows)),
        ).fetchall()
        if variant.copy:
            with conn.cursor().copy(COPY_EVENTS_SQL) as copy:
                copy.set_types(COPY_EVENT_TYPES)
                for row in zip(*columns, strict=True):
                    copy.write_row(row)
        else:
            conn.execute(_UNNEST_SQL, columns)
        conn.execute(
            "INSERT INTO event_types (type) VALUES (%s) ON CONFLICT (type) DO NOTHING",
            (f'["b","{EVENT_TYPE}"]',),
        )
    with store.timed("commit") as conn:
        conn.commit()


def _record_chunk(app: _Timed, rows: list[Any]) -> None:
    """The relay's outcome for one chunk: every row PUBLISHED, in one UPDATE."""
    from tidings.pipeline.publishing.outcome import _update_sql

    now = datetime.now(UTC)
    deliveries = json.dumps(
        {"store": {"state": "CONFIRMED", "at": now.isoformat()}}, separators=(",", ":")
    )
    seqs = [row[0] for row in rows]
    with app.timed("status update") as conn:
        conn.execute(
            _update_sql("postgresql", "%s", over_parked=True),
            ("PUBLISHED", 0, None, deliveries, now, now, seqs),
        )
        conn.execute(
            "INSERT INTO tidings_target_mark (target, confirmed_at) VALUES (%s, %s) "
            "ON CONFLICT (target) DO UPDATE SET confirmed_at = "
            "greatest(tidings_target_mark.confirmed_at, excluded.confirmed_at)",
            ("store", now),
        )


def _open_before(app: _Timed, rows: list[Any]) -> None:
    first: dict[str, int] = {}
    for row in rows:
        first.setdefault(row[6], row[0])
    with app.timed("open rows before") as conn:
        conn.execute(_OPEN_BEFORE_SQL, (list(first), list(first.values()))).fetchall()


def measure(
    app_url: str, store_url: str, variant: Variant, parts: int = 2, chunk: int = 20_000
) -> Floor:
    """Run the relay's SQL on the backlog in ``app_url`` into the store at ``store_url``,
    one slice after the other, as the relay's tasks would."""
    floor = Floor()
    app, store, writer = _Timed(app_url, floor), _Timed(store_url, floor), _Timed(app_url, floor)
    lsn = "SELECT pg_current_wal_lsn()"
    try:
        upto = app.conn.execute("SELECT max(seq) FROM outbox_event").fetchone()[0]  # type: ignore[index]
        app.conn.commit()
        counters = {"position": 0, "session": 0, "instance": 0}
        started_lsn = app.conn.execute(lsn).fetchone()[0]  # type: ignore[index]
        app.conn.commit()
        server_before = sum(postgres_cpu().values())
        started = time.perf_counter()
        for index in range(parts):
            for rows in _chunks(app, upto, index, parts, chunk):
                _open_before(writer, rows)
                _store_chunk(store, rows, counters, variant)
                _record_chunk(writer, rows)
                with writer.timed("commit") as conn:
                    conn.commit()
        floor.wall = time.perf_counter() - started
        floor.server = sum(postgres_cpu().values()) - server_before
        ended_lsn = app.conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (started_lsn,)
        ).fetchone()[0]  # type: ignore[index]
        floor.wal_bytes["all"] = int(ended_lsn)
    finally:
        for conn in (app, store, writer):
            conn.close()
    return floor


def postgres_floor(events: int, keys: int, variant: Variant | None = None) -> Floor:
    """Fresh databases, a backlog of ``events`` through the Outbox, then :func:`measure`."""
    variant = variant or Variant()
    tag = uuid.uuid4().hex[:8]
    with scratch_database(f"tidings_floor_app_{tag}") as app_url:
        engine = make_engine(app_url)
        outbox = Outbox(engine)
        with psycopg.connect(app_url, autocommit=True) as conn:
            for statement in variant.app_ddl:
                conn.execute(statement)  # type: ignore[arg-type]
        secs = fill_backlog(outbox, events, keys)
        engine.dispose()
        say(f"  floor backlog of {events:,} emitted in {secs:.1f} s")
        return floor_of(app_url, variant)


def floor_of(app_url: str, variant: Variant | None = None, *, copy: bool = True) -> Floor:
    """:func:`measure` on the backlog in ``app_url`` (on a copy of it, unless ``copy`` is
    off: then the backlog is used up), into a fresh event store; both dropped afterwards.
    A database to copy must have no one connected to it."""
    from tidings.server.store import EventStore

    variant = variant or Variant()
    tag = uuid.uuid4().hex[:8]
    with contextlib.ExitStack() as stack:
        copy_url = app_url
        if copy:
            name = f"tidings_floor_app_{tag}"
            copy_url = stack.enter_context(scratch_database(name, template=app_url))
        store_url = stack.enter_context(scratch_database(f"tidings_floor_store_{tag}"))
        EventStore(store_url).close()
        with psycopg.connect(store_url, autocommit=True) as conn:
            for statement in variant.store_ddl:
                conn.execute(statement)  # type: ignore[arg-type]
            conn.execute("CHECKPOINT")
        return measure(copy_url, store_url, variant)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--unnest", action="store_true", help="INSERT ... unnest, not COPY")
    parser.add_argument("--in-lookup", action="store_true", help="IN lists of 500, not ANY")
    parser.add_argument("--app-ddl", action="append", default=[])
    parser.add_argument("--store-ddl", action="append", default=[])
    args = parser.parse_args()
    variant = Variant(
        not args.unnest, not args.in_lookup, tuple(args.app_ddl), tuple(args.store_ddl)
    )
    floor = postgres_floor(args.events, args.keys, variant)
    say(floor.per_event(args.events))
    say(f"  wall {floor.wall:.1f} s, WAL {floor.wal_bytes['all'] / args.events:,.0f} B/event")


if __name__ == "__main__":
    main()
