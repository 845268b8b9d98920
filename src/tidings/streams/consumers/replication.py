"""A consumer's position in terms every server of a redundant group understands.

A stream position is one store's local number: the same event has different positions on
two servers of a pair, and the two logs may even interleave the servers' events
differently. What the servers share is the event id ``(server, session, instance)``, which
the Syncer preserves, and the order of each server's own events, which every log keeps
(the Syncer client resumes after the last id of that server and stores in id order).

So a consumer's acknowledged position travels as its *covers*: for each origin server,
the id of the newest of that server's events the consumer has passed. Every event of that
server up to that id has been acknowledged, on whichever server it was read. A server that
learns a consumer's covers moves the consumer's local position to the end of the longest
prefix of its own log that the covers cover (:func:`covered_prefix`): nothing after it has
been acknowledged for sure, so nothing is lost; events the covers cover that lie beyond it
(logged in another order here) are sent again, the at-least-once side of the bargain. An
outbox event that two servers stored under their own ids (the relay sent it to both) has
two names; each store records the other's as its copy, and either name counts as covered.

The covers travel as events of the reserved type
``tidings/stream/consumer/<stream>/<user>/<component>/<origin server>`` in the log
(:data:`~tidings.streams.typemap.CONSUMER_TYPE`), so the Syncer carries them without any
change to its wire. Each carries the consumer's whole covers as its origin server knew them,
which only grow: the latest event of such a type supersedes the earlier ones, and the
compaction (:mod:`.compaction`) deletes those.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from sqlalchemy import Connection, func, select
from sqlalchemy.sql import ColumnElement

from tidings.errors import StreamError
from tidings.events.model import (
    EventId,
    EventType,
    NewEvent,
    PayloadKind,
    StoredEvent,
    encode_type,
)
from tidings.events.validation import INT64_MAX
from tidings.server.store.copies import copies_between
from tidings.server.store.schema import decode_type, events_table
from tidings.streams.protocol.ftn3 import INVALID_REQUEST
from tidings.streams.typemap import CONSUMER_TYPE

#: The query pattern of every consumer event.
CONSUMER_PATTERN: EventType = (*CONSUMER_TYPE, "*")

#: Per origin server: the ``(session, instance)`` of the newest of its events passed.
Covers = dict[int, tuple[int, int]]

#: The longest consumer names the positions' tables keep (their column lengths).
NAME_LENGTHS = {"stream": 64, "user": 64, "component": 16}

#: Events read per step when moving a position over covered events.
_SCAN_STEP = 1000


def merged(old: Mapping[int, tuple[int, int]], new: Mapping[int, tuple[int, int]]) -> Covers:
    """The covers of both (per server the newer id): covers only ever grow."""
    result = dict(old)
    for server, ident in new.items():
        if ident > result.get(server, (0, 0)):
            result[server] = ident
    return result


def ids_between(conn: Connection, after: int, upto: int) -> Covers:
    """The covers of the log's events at positions ``(after, upto]``: per server, the id of
    its event of the highest position there (its newest, as each server's events are in id
    order in every log). Consumer events do not count: no consumer reads them, and were
    they counted, the position moving past one would write another, without end."""
    e = events_table.c
    newest = (
        select(func.max(e.position))
        .where(e.position > after, e.position <= upto, _not_consumer_event())
        .group_by(e.server)
    )
    rows = conn.execute(select(e.server, e.session, e.instance).where(e.position.in_(newest))).all()
    return {int(server): (int(session), int(instance)) for server, session, instance in rows}


def covered_prefix(
    conn: Connection,
    start: int,
    covers: Mapping[int, tuple[int, int]],
    carried: Callable[[EventType], bool] | None = None,
) -> int:
    """The end of the longest run of the log after ``start`` whose events ``covers`` all
    cover: the position a consumer at ``start`` with those covers may move to. Events no
    consumer of the stream could be sent do not stop the run: consumer events, and, given
    ``carried`` (whether the consumer's stream carries a type), the types it does not carry,
    such as this server's own status events, which the peer that wrote the covers may
    have logged elsewhere in its order or not at all. An event held here under one id may
    have been read elsewhere under another (a peer's copy of the same outbox event, which
    the store skipped and recorded, :mod:`tidings.server.store.copies`): covering either
    counts."""
    e = events_table.c
    position = start
    while True:
        rows = conn.execute(
            select(e.position, e.server, e.session, e.instance, e.type)
            .where(e.position > position, _not_consumer_event())
            .order_by(e.position)
            .limit(_SCAN_STEP)
        ).all()
        copies = copies_between(conn, position, int(rows[-1][0])) if rows else {}
        for row_position, server, session, instance, type_text in rows:
            names = [EventId(server, session, instance), *copies.get(int(row_position), ())]
            if not any(_covered(covers, name) for name in names) and (
                carried is None or carried(decode_type(type_text))
            ):
                return position
            position = int(row_position)
        if len(rows) < _SCAN_STEP:
            return position


def _covered(covers: Mapping[int, tuple[int, int]], event: EventId) -> bool:
    return (event.session, event.instance) <= covers.get(event.server, (0, 0))


def _not_consumer_event() -> ColumnElement[bool]:
    """The SQL condition that an event is not a consumer event (its type text does not
    start with the reserved prefix's: a range of the type index)."""
    return ~events_table.c.type.startswith(encode_type(CONSUMER_TYPE)[:-1] + ",")


def consumer_event(
    server_id: int, stream: str, user: str, component: str, covers: Covers
) -> NewEvent:
    """The event by which server ``server_id`` tells the group that a consumer is registered
    and what it has passed."""
    payload = {
        "stream": stream,
        "user": user,
        "component": component,
        "covers": [[server, *ident] for server, ident in sorted(covers.items())],
    }
    return NewEvent(
        (*CONSUMER_TYPE, stream, user, component, str(server_id)),
        json.dumps(payload, separators=(",", ":")).encode(),
        PayloadKind.JSON,
    )


def read_consumer_event(event: StoredEvent) -> tuple[str, str, str, Covers]:
    """``(stream, user, component, covers)`` of a consumer event; InvalidRequest if it is
    not one this version can read or its origin did not write it (a peer's event is data
    from outside: whatever is wrong with it, it must not stop the sync, and nothing in it
    may reach the database unchecked)."""
    try:
        return _read(event)
    except Exception as exc:  # anything: a nesting too deep for json (RecursionError) too
        raise StreamError(
            INVALID_REQUEST,
            f"consumer event {event.id} is malformed: {type(exc).__name__}: {str(exc)[:200]}",
        ) from None


def _read(event: StoredEvent) -> tuple[str, str, str, Covers]:
    payload = json.loads(event.payload or b"")
    stream, user, component = (str(payload[key]) for key in ("stream", "user", "component"))
    # Its type names the consumer and the server that wrote it: only that server may speak
    # for it (an event registered elsewhere with a forged type is refused).
    expected = (*CONSUMER_TYPE, stream, user, component, str(event.id.server))
    if tuple(event.type) != expected:
        raise ValueError(f"type {event.type!r} is not that of its payload and origin")
    for name, value in (("stream", stream), ("user", user), ("component", component)):
        if not 0 < len(value) <= NAME_LENGTHS[name]:
            raise ValueError(f"{name} must be 1 to {NAME_LENGTHS[name]} characters long")
        if "\x00" in value:  # PostgreSQL refuses a NUL in text (and json can make one)
            raise ValueError(f"{name} holds a NUL")
        value.encode()  # UnicodeEncodeError for a lone surrogate, which json can make too
    covers: Covers = {}
    for server, session, instance in payload["covers"]:
        ident = tuple(int(n) for n in (server, session, instance))
        if not all(1 <= n <= INT64_MAX for n in ident):
            raise ValueError(f"cover {list(ident)} is outside 1..{INT64_MAX}")
        covers[ident[0]] = (ident[1], ident[2])
    return stream, user, component, covers
