"""The live tail: the events committed to the outbox, or stored by one of the file's event
servers, from the moment the page opened, as they come.

A tail polls its source after the last position it sent, along the source's own order and
primary key (the outbox's ``seq``, the store's ``position``): one indexed read of at most
:data:`BATCH` rows every :data:`POLL_S`, whatever the size of the log, and nothing at all
while no event comes. The type filter is applied to what was read: an outbox type or a
prefix ending in ``*``; a server's type pattern in Hat's form (``orders/*``, ``?`` for one
segment).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Engine, func, select
from starlette.concurrency import run_in_threadpool

from tidings.config import TidingsConfig
from tidings.config.streams import StreamServerConfig
from tidings.errors import TidingsError, UsageError
from tidings.events.matching import QueryType, matches, validate_query_type
from tidings.events.timeutil import as_utc
from tidings.outbox.schema import outbox_event
from tidings.redaction import scrub
from tidings.server.store import EventStore
from tidings.streams.consumers.admin import open_store

#: Seconds between two reads of a tail's source; rows read at most per read.
POLL_S = 0.5
BATCH = 200
#: Payload characters sent per event (the rest is cut, and says so).
MAX_PAYLOAD = 4_000


@dataclass(frozen=True)
class TailItem:
    """One event as the tail shows it."""

    position: int
    event_type: str
    at: str
    key: str
    event_id: str
    payload: str

    def as_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


class OutboxTail:
    """The outbox's events as they are committed (in ``seq`` order)."""

    def __init__(self, engine: Engine, pattern: str) -> None:
        self.engine = engine
        self.pattern = pattern

    def newest(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.max(outbox_event.c.seq))).scalar() or 0)

    def after(self, position: int) -> tuple[int, list[TailItem]]:
        """The next events after ``position`` that match, and the position read up to."""
        oe = outbox_event.c
        query = (
            select(oe.seq, oe.event_type, oe.logged_at, oe.partition_key, oe.event_id, oe.payload)
            .where(oe.seq > position)
            .order_by(oe.seq)
            .limit(BATCH)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        items = [
            TailItem(
                r.seq,
                r.event_type,
                as_utc(r.logged_at).isoformat(),
                r.partition_key or "",
                r.event_id,
                _cut(r.payload),
            )
            for r in rows
            if _outbox_type_matches(r.event_type, self.pattern)
        ]
        return (rows[-1].seq if rows else position), items

    def close(self) -> None:
        """Nothing of its own to release (the console's engine is shared)."""


class StoreTail:
    """One event server's stored events as they come (in ``position`` order), read from its
    store as ``tidings streams status`` reads it: a server that is down shows nothing new.
    The store is opened by :meth:`newest`, the tail's first read."""

    def __init__(self, server: StreamServerConfig, query: QueryType | None) -> None:
        self.server = server
        self.query = query
        self.store: EventStore | None = None

    def newest(self) -> int:
        if self.store is None:
            self.store = open_store(self.server)
        return self.store.last_position()

    def after(self, position: int) -> tuple[int, list[TailItem]]:
        assert self.store is not None, "newest() opens the store"
        events = self.store.read(position, BATCH)
        items = [
            TailItem(
                e.position,
                "/".join(e.type),
                str(e.timestamp_us),
                "",
                e.outbox_event_id or "",
                _cut((e.payload or b"").decode("utf-8", "replace")),
            )
            for e in events
            if self.query is None or matches(e.type, self.query)
        ]
        return (events[-1].position if events else position), items

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def open_tail(
    config: TidingsConfig, engine: Engine, source: str, pattern: str
) -> OutboxTail | StoreTail:
    """The tail of ``source`` (``outbox`` or ``server:NAME``) filtered by ``pattern``; a
    UsageError names a source the file does not have or a bad pattern."""
    pattern = pattern.strip()
    if source == "outbox":
        return OutboxTail(engine, pattern)
    kind, _, name = source.partition(":")
    if kind != "server" or name not in config.servers:
        choices = ", ".join(["outbox", *(f"server:{n}" for n in sorted(config.servers))])
        raise UsageError(f"source: {source!r} is not one of {choices}")
    query = None
    if pattern:
        try:
            query = validate_query_type(tuple(pattern.split("/")))
        except TidingsError as exc:
            raise UsageError(f"type pattern: {exc}") from None
    return StoreTail(config.servers[name], query)


async def follow(
    tail: OutboxTail | StoreTail, source: str, alive: Callable[[], bool]
) -> AsyncIterator[str]:
    """The server-sent events of ``tail`` while ``alive()`` (the login lasts and the console
    runs): each matching event as one JSON ``data:`` line; ``problem`` says why the source
    cannot be read (it is tried again), ``end`` that the login ended. The source is opened
    here, by the first read, and closed at the end however the stream ends."""
    try:
        position: int | None = None  # from the source's newest, once it can be read
        yield f": tail of {source}\n\n"
        while True:
            if not alive():
                yield "event: end\ndata: the login ended, or the console stops\n\n"
                return
            items: list[TailItem] = []
            try:
                if position is None:
                    position = await run_in_threadpool(tail.newest)
                else:
                    position, items = await run_in_threadpool(tail.after, position)
            except Exception as exc:
                lines = str(exc).strip().splitlines() or [type(exc).__name__]
                yield f"event: problem\ndata: {json.dumps(scrub(lines[0])[:300])}\n\n"
            for item in items:
                yield f"id: {item.position}\ndata: {item.as_json()}\n\n"
            await asyncio.sleep(POLL_S)
    finally:
        await run_in_threadpool(tail.close)


def _outbox_type_matches(event_type: str, pattern: str) -> bool:
    if not pattern or pattern == "*":
        return True
    if pattern.endswith("*"):
        return event_type.startswith(pattern[:-1])
    return event_type == pattern


def _cut(payload: Any) -> str:
    text = str(payload)
    if len(text) <= MAX_PAYLOAD:
        return text
    return text[:MAX_PAYLOAD] + f"… ({len(text) - MAX_PAYLOAD} more characters)"
