"""Query replies (``MsgQueryRes``) of any size, built off the event loop in bounded memory.

A query without ``max_results`` may select every event of the store, and it is answered
with all of them, as hat-event does. Built the simple way (rows, then events, then wire
records, then one SBS body, then one frame) a reply of 200,000 events took a gigabyte and
seconds of the event loop. Here a reply is planned in the query pool: the rows are read and
encoded a chunk at a time (:func:`plan_reply`); a reply up to :data:`INLINE_REPLY_BYTES`
keeps its encoded body and is sent at once, a larger one keeps only its events' positions
(8 bytes each) and its exact size, which the frame's head needs before the body. The body
is then re-read by position and encoded a chunk at a time as the client takes the bytes
(:func:`stream_body`, with :meth:`Connection.send_stream`), so memory holds one chunk, not
the reply.

Planning reads one snapshot of the store for as long as it takes (seconds for the largest
results), never for as long as a client takes to read. Events are never changed once
stored, so the second read gives the same bytes; an event that vanished meanwhile would
change the size, and the reply is then given up with the connection (StoreError).
"""

from __future__ import annotations

from array import array
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from tidings.server.async_engine import AsyncEngine
from tidings.server.query import QueryData, events_at, query_chunks
from tidings.server.store import EventStore, StoredEvent, StoreError
from tidings.wire import codec

#: A reply up to this size is built whole and sent in one write.
INLINE_REPLY_BYTES = 1024 * 1024
#: Events read and encoded per piece of a reply.
CHUNK_EVENTS = 1000

_EVENTER = "HatEventer"
_REPLY = "MsgQueryRes"


@dataclass(frozen=True, slots=True)
class ReplyPlan:
    """A planned reply: its whole ``body`` if small, else the ``positions`` to read it from."""

    count: int
    #: The size of the encoded body, in bytes.
    size: int
    body: bytes | None
    positions: array[int]


#: The reply without events (to a query refused as invalid).
EMPTY_REPLY = ReplyPlan(0, 1, codec.encode_integer(0), array("q"))


def is_bulk(query: QueryData) -> bool:
    """Whether the query may select more than a chunk of events (it then runs in the
    engine's bulk pool, see :meth:`AsyncEngine.read`)."""
    return query.max_results is None or query.max_results > CHUNK_EVENTS


def plan_reply(store: EventStore, query: QueryData) -> ReplyPlan:
    """Read and encode the query's result a chunk at a time (blocking: run it in a thread)."""
    pieces: list[bytes] | None = []
    positions: array[int] = array("q")
    size = 0
    for events in query_chunks(store, query, CHUNK_EVENTS):
        for start in range(0, len(events), CHUNK_EVENTS):
            chunk = events[start : start + CHUNK_EVENTS]
            items = encode_items(chunk)
            size += len(items)
            positions.extend(event.position for event in chunk)
            if pieces is not None:
                pieces.append(items)
                if size > INLINE_REPLY_BYTES:
                    pieces = None  # too large to keep: streamed from the positions
    head = codec.encode_integer(len(positions))
    if pieces is not None:
        return ReplyPlan(len(positions), len(head) + size, head + b"".join(pieces), array("q"))
    return ReplyPlan(len(positions), len(head) + size, None, positions)


def encode_items(events: Sequence[StoredEvent]) -> bytes:
    """``events`` as the items of an SBS ``Array(Event)``: its encoding without the count."""
    encoded = codec.encode(_EVENTER, _REPLY, [codec.event_to_sbs(event) for event in events])
    return encoded[len(codec.encode_integer(len(events))) :]


async def stream_body(engine: AsyncEngine, plan: ReplyPlan) -> AsyncIterator[bytes]:
    """The body of a large planned reply, a chunk at a time, each read and encoded in the
    query pool when the one before has been taken."""
    yield codec.encode_integer(plan.count)
    for start in range(0, plan.count, CHUNK_EVENTS):
        wanted = plan.positions[start : start + CHUNK_EVENTS]
        yield await engine.read(_encode_at, engine.store, wanted, bulk=True)


def _encode_at(store: EventStore, positions: Sequence[int]) -> bytes:
    events = events_at(store, positions)
    if len(events) != len(positions):
        raise StoreError(
            f"{len(positions) - len(events)} events of a query reply vanished from the store "
            "while it was being sent"
        )
    return encode_items(events)
