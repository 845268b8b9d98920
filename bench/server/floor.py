"""The least a Python asyncio Eventer server does per register: the benchmark's ceiling.

With ``store: commit`` or ``store: periodic`` in its configuration it also runs, per
register, the SQL statements tidings' SQLite store runs (on the store's own schema and
pragmas, with its checkpoint thread), and nothing else of tidings' engine: the ceiling of
a server that stores as tidings does, for each durability (see :class:`FloorStore`). The
registers read from a socket at once are stored together (one commit under ``commit``), as
tidings stores requests that queued up together, so that its fire-and-forget rate is a
ceiling there too.

``python -m bench.server.floor --conf server.yaml`` (``address: tcp+sbs://host:port``) answers
hat-event 0.8.5's ``MsgRegisterReq`` as a server would — frame, pre-scan and decode with
tidings' wire code (hat-sbs), number the events, encode the reply, send — and stores nothing,
runs no engine and serves no query (pings are answered, as hat's client needs). It keeps
each connection's subscription and sends a register's events to the subscribers they match
(``MsgNotify``, encoded once per register, sent before the reply, as tidings sends it), so
that the notify latency has a floor too: with a store, once the register is written (under
``commit``, committed).
One asyncio Protocol, no tasks per connection. Driven by the same client as the real servers
(the server benchmark), its register rates are what no Python server on this machine can beat:
what is left between it and a real server is the cost of storing, the engine and serving
many clients safely.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tidings.address import parse_address
from tidings.events.matching import TypeMatcher
from tidings.events.model import encode_type
from tidings.server.store import EventStore
from tidings.server.store.counters import (
    POSITION_COUNTER,
    advance_counters,
    instance_counter,
    session_counter,
)
from tidings.server.store.driver import STORE_SQLITE_PRAGMAS, DriverCursor
from tidings.server.store.planning import insert_event_rows
from tidings.server.store.sources import insert_sources
from tidings.wire import codec, envelope

_US = 1_000_000


class FloorStore:
    """The statements of tidings' SQLite store per register (its own functions, on its
    pragmas), and nothing else: with
    ``periodic`` a transaction held open, each register in a savepoint of its own (the
    counters kept in memory) and a commit every ``flush_period``; else each register in its
    own transaction that advances the counters and commits. Each register inserts its event
    rows and one ``event_sources`` row, as tidings' store does; the registers read from a
    connection at once are written together (:meth:`write`), as tidings groups queued
    requests."""

    def __init__(self, path: Path, periodic: bool, flush_period: float) -> None:
        # The store makes the schema and the counters, and keeps its checkpoint thread.
        self.store = EventStore(f"sqlite:///{path}")
        self.periodic = periodic
        self.flush_period = flush_period
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in (*STORE_SQLITE_PRAGMAS, "PRAGMA temp_store = MEMORY"):
            self.db.execute(pragma)
        #: The store's own statement functions run on this cursor.
        self.sql = DriverCursor(self.db.cursor(), False, sqlite3.Error)
        self.counters: dict[str, int] | None = None  # the held transaction's
        self.flushing: asyncio.TimerHandle | None = None

    def write(self, registers: list[tuple[list[tuple[Any, ...]], tuple[Any, ...]]]) -> None:
        """Store the registers that arrived together (each its event rows, positions and ids
        already in them, and its source row) in one transaction, or one savepoint of the
        held one, as tidings stores a group of queued requests."""
        sql = self.sql
        rows = [row for register_rows, _ in registers for row in register_rows]
        sources = [source for _, source in registers]
        increments = {
            POSITION_COUNTER: len(rows),
            session_counter(1): len(registers),
            instance_counter(1): len(rows),
        }
        if not self.periodic:
            sql.rows("BEGIN IMMEDIATE")
            advance_counters(sql, increments)
            insert_event_rows(sql, rows)
            insert_sources(sql, sources)
            sql.rows("COMMIT")
            return
        if self.counters is None:
            sql.rows("BEGIN IMMEDIATE")
            self.counters = dict(sql.rows("SELECT name, value FROM event_counters"))
            self.flushing = asyncio.get_running_loop().call_later(self.flush_period, self.flush)
        sql.rows("SAVEPOINT tidings_write")
        for name, increment in increments.items():
            self.counters[name] += increment
        insert_event_rows(sql, rows)
        insert_sources(sql, sources)
        sql.rows("RELEASE SAVEPOINT tidings_write")

    def flush(self) -> None:
        """Commit the held transaction (on the loop: tidings commits it in its write
        thread, so this floor is a little low)."""
        if self.counters is not None:
            self.sql.executemany(
                "UPDATE event_counters SET value = ? WHERE name = ?",
                [(value, name) for name, value in sorted(self.counters.items())],
            )
            self.sql.rows("COMMIT")
            self.counters = None


def _row(position: int, session: int, instance: int, item: Any, now: int) -> tuple[Any, ...]:
    """An event row (tidings' columns) of one decoded RegisterEvent."""
    source = item["sourceTimestamp"]
    payload = item["payload"]
    data: bytes | None = None
    kind: str | None = None
    if payload[0] == "value":
        kind, value = payload[1]
        if kind == "json":
            data = value.encode()
        elif kind == "binary":
            data = value
        else:
            data = codec.encode("Hat", "Data", value)
    return (
        position,
        1,
        session,
        instance,
        encode_type(tuple(item["type"])),
        now,
        None if source[0] == "none" else source[1]["s"] * _US + source[1]["us"],
        data,
        kind,
        None,
    )


@dataclass(slots=True)
class _Register:
    """One register request, decoded and numbered: stored, notified and answered later."""

    received: envelope.Envelope
    events: list[dict[str, Any]]
    #: Its event rows and ``event_sources`` row (None: nothing to store).
    rows: list[tuple[Any, ...]]
    source: tuple[Any, ...] | None


class FloorProtocol(asyncio.Protocol):
    """One connection: frames in, register replies out."""

    def __init__(
        self,
        numbers: itertools.count[int],
        subscribers: dict[FloorProtocol, TypeMatcher],
        store: FloorStore | None = None,
    ) -> None:
        self._numbers = numbers
        #: Every connection's subscription (shared by the server's connections).
        self._subscribers = subscribers
        self._store = store
        self._buffer = bytearray()
        self._ids = itertools.count(1)
        self._transport: asyncio.Transport | None = None
        self._session = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._subscribers.pop(self, None)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        #: The registers of this read, stored together, then notified and answered in order.
        registers: list[_Register] = []
        try:
            while self._buffer:
                length_size = self._buffer[0]
                if len(self._buffer) < 1 + length_size:
                    return
                size = int.from_bytes(self._buffer[1 : 1 + length_size], "big")
                end = 1 + length_size + size
                if len(self._buffer) < end:
                    return
                frame = bytes(self._buffer[1 + length_size : end])
                del self._buffer[:end]
                received = envelope.parse(frame)
                if (received.module, received.type) == (codec.EVENTER, "MsgRegisterReq"):
                    registers.append(self._register(received))
                else:
                    self._finish(registers)
                    registers = []
                    self._on_other(received)
        finally:
            self._finish(registers)

    def _on_other(self, received: envelope.Envelope) -> None:
        if received.module == codec.PING and received.type == "MsgPing":
            self._send(
                received.first, codec.PING, "MsgPong", codec.encode(codec.PING, "MsgPong", None)
            )
        elif (received.module, received.type) == (codec.EVENTER, "MsgSubscribe"):
            types = codec.decode(received.module, received.type, received.body)
            self._subscribers[self] = TypeMatcher([tuple(t) for t in types])

    def _register(self, received: envelope.Envelope) -> _Register:
        """Decode and number one register request."""
        items = codec.decode(received.module, received.type, received.body)
        self._session += 1
        now = time.time_ns() // 1000
        timestamp = {"s": now // _US, "us": now % _US}
        instances = [next(self._numbers) for _ in items]
        events = [
            {
                "id": {"server": 1, "session": self._session, "instance": instance},
                "type": item["type"],
                "timestamp": timestamp,
                "sourceTimestamp": item["sourceTimestamp"],
                "payload": item["payload"],
            }
            for item, instance in zip(items, instances, strict=True)
        ]
        if self._store is None or not items:
            return _Register(received, events, [], None)
        # One counter for positions and instances: the floor's one server is alone.
        rows = [
            _row(instance, self._session, instance, item, now)
            for item, instance in zip(items, instances, strict=True)
        ]
        return _Register(
            received, events, rows, (1, self._session, instances[0], "eventer", 1, None)
        )

    def _finish(self, registers: list[_Register]) -> None:
        """Store the registers (those with events), then notify and answer each."""
        if not registers:
            return
        stored = [(r.rows, r.source) for r in registers if r.source is not None]
        if self._store is not None and stored:
            self._store.write(stored)
        for register in registers:
            if self._subscribers and register.events:
                self._notify(register.events)
            if not register.received.last:
                results = [("event", event) for event in register.events]
                body = codec.encode(codec.EVENTER, "MsgRegisterRes", results)
                self._send(register.received.first, codec.EVENTER, "MsgRegisterRes", body)

    def _notify(self, events: list[dict[str, Any]]) -> None:
        """Each subscriber gets the events of this register its subscription matches."""
        bodies: dict[tuple[int, ...], bytes] = {}
        for subscriber, matcher in self._subscribers.items():
            selection = tuple(
                i for i, event in enumerate(events) if matcher.matches(tuple(event["type"]))
            )
            if not selection:
                continue
            body = bodies.get(selection)
            if body is None:
                chosen = [events[i] for i in selection]
                body = bodies[selection] = codec.encode(codec.EVENTER, "MsgNotify", chosen)
            subscriber._send(0, codec.EVENTER, "MsgNotify", body, last=True)

    def _send(
        self, first: int, module: str, type_name: str, body: bytes, *, last: bool = True
    ) -> None:
        """One message: a reply in the conversation ``first``, or (``first`` 0) a new one."""
        assert self._transport is not None
        number = next(self._ids)
        head = envelope.frame_head(
            number, first or number, first == 0, last, module, type_name, len(body)
        )
        self._transport.write(head + body)


async def serve(address: str, store: FloorStore | None = None) -> None:
    host, port = parse_address(address)
    numbers = itertools.count(1)
    subscribers: dict[FloorProtocol, TypeMatcher] = {}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: FloorProtocol(numbers, subscribers, store), host, port
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conf", type=Path, required=True)
    config = yaml.safe_load(parser.parse_args().conf.read_text())
    durability = config.get("store")

    async def main() -> None:
        store = None
        if durability is not None:
            store = FloorStore(Path("ev.db").absolute(), durability == "periodic", 1.0)
        await serve(config["address"], store)

    asyncio.run(main())


if __name__ == "__main__":
    main()
