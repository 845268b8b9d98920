"""Query replies (``MsgQueryRes``) of any size, built off the event loop in bounded memory.

A query without ``max_results`` may select every event of the store, and it is answered
with all of them, as hat-event does. Built the simple way (rows, then events, then wire
records, then one SBS body, then one frame) a reply of 200,000 events took a gigabyte and
seconds of the event loop. Here a reply is planned in the engine's bulk pool
(:func:`plan_reply`): the rows are read and encoded a chunk at a time into a spool that
stays in memory up to :data:`INLINE_REPLY_BYTES` and moves to an anonymous temporary file
beyond. A small reply is then sent in one write; a large one is streamed from the file as
the client takes the bytes (:meth:`Connection.send_stream`), its size known in advance as
the frame's head needs. Memory holds one chunk, not the reply; the disk holds a large reply
until it is sent (the file has no name and disappears when closed, or with the process).

Why a file and not a second read of the store: the frame is written once started, so
frames for the same client (pongs included) wait until it ends. Streamed from a file it
lasts as long as the client takes to read; re-read and re-encoded as it goes, it lasted as
long as the server took to encode it twice, and hat-event's client gives up on a pong after
20 s: four concurrent replies of 200,000 events on two cores took longer than that.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import IO, Any

from tidings.events.model import EventId, EventType
from tidings.events.query import QueryData
from tidings.server.store import EVENT_COLUMNS, EventStore, events_from_rows
from tidings.server.store.latest_by_key import latest_by_key_rows
from tidings.server.store.queries import query_rows
from tidings.wire import codec

#: A reply up to this size is built in memory and sent in one write; a larger one is
#: spooled to a temporary file and streamed.
INLINE_REPLY_BYTES = 1024 * 1024
#: Events read and encoded per chunk of a reply.
CHUNK_EVENTS = 1000
#: Bytes of a spooled reply read per piece written to the socket.
_PIECE_BYTES = 256 * 1024

#: Encodings kept for the replies of bounded queries, by stored row: clients ask for the
#: same latest values again and again, and turning rows into events and encoding them was
#: most of such a reply's time (3,000 latest values: 30 -> 8 ms of CPU, measured). A
#: row's encoding depends on the row alone, so an entry is never stale. Rows with larger
#: payloads are encoded each time.
ENCODED_ROWS_KEPT = 16_384
_KEPT_PAYLOAD_BYTES = 1024
_PAYLOAD = EVENT_COLUMNS.index("payload")
#: Replies of queries bounded to at most this many events use (and fill) the kept
#: encodings; larger ones are encoded a chunk per call and would only churn them.
_KEPT_REPLY_EVENTS = 4096


@dataclass(frozen=True, slots=True)
class ReplyPlan:
    """A planned reply: its whole ``body`` if small, else the ``spool`` holding its items
    (the body without its count); :meth:`close` it once sent."""

    count: int
    #: The size of the encoded body, in bytes.
    size: int
    body: bytes | None
    spool: IO[bytes] | None = None

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()


#: The reply without events (to a query refused as invalid).
EMPTY_REPLY = ReplyPlan(0, 1, codec.encode_integer(0))


def is_bulk(query: QueryData) -> bool:
    """Whether the query may select more than a chunk of events (it then runs in the
    engine's bulk pool, see :meth:`AsyncEngine.read`)."""
    return query.max_results is None or query.max_results > CHUNK_EVENTS


def plan_reply(store: EventStore, query: QueryData) -> ReplyPlan:
    """Read and encode the query's result a chunk at a time (blocking: run it in a thread)."""
    bounded = query.max_results is not None and query.max_results <= _KEPT_REPLY_EVENTS
    return plan_rows(query_rows(store, query, CHUNK_EVENTS), keep=bounded)


def plan_latest_by_key(
    store: EventStore, event_type: EventType, after: EventId | None, max_bytes: int | None
) -> ReplyPlan:
    """The reply of one page of the newest event of each key of ``event_type``: the keys
    whose newest event comes after the event ``after``, at most ``max_bytes`` of events
    (at least one) (blocking)."""
    chunks = latest_by_key_rows(store, event_type, CHUNK_EVENTS, after)
    try:
        return plan_rows(chunks, max_bytes=max_bytes)
    finally:
        chunks.close()  # a page cut short ends the store's snapshot now


def plan_rows(
    chunks: Iterable[Sequence[tuple[Any, ...]]],
    *,
    keep: bool = False,
    max_bytes: int | None = None,
) -> ReplyPlan:
    """The reply of the stored rows ``chunks`` yields (blocking: run it in a thread); with
    ``keep``, small rows' encodings are kept for the next reply; with ``max_bytes``, the
    reply stops before the event that would take its events past that many bytes (it holds
    one event at least)."""
    spool = tempfile.SpooledTemporaryFile(max_size=INLINE_REPLY_BYTES)  # noqa: SIM115
    count = size = 0
    encode = _encode_kept if keep else _encode_rows
    try:
        for events, block in _blocks(chunks, encode, each=max_bytes is not None):
            if max_bytes is not None and count and size + len(block) > max_bytes:
                break
            size += spool.write(block)
            count += events
        head = codec.encode_integer(count)
        spool.seek(0)
        if size > INLINE_REPLY_BYTES:
            return ReplyPlan(count, len(head) + size, None, spool)  # the plan closes it
        body = head + spool.read()
    except BaseException:
        spool.close()
        raise
    spool.close()
    return ReplyPlan(count, len(body), body)


def _blocks(
    chunks: Iterable[Sequence[tuple[Any, ...]]],
    encode: Callable[[Sequence[tuple[Any, ...]]], bytes],
    *,
    each: bool,
) -> Iterator[tuple[int, bytes]]:
    """The encoded rows as (events, bytes): a chunk of events at a time, or, with ``each``,
    one event at a time (a reply bounded in bytes is cut between two events)."""
    for rows in chunks:
        for start in range(0, len(rows), CHUNK_EVENTS):
            chunk = rows[start : start + CHUNK_EVENTS]
            if each:
                yield from ((1, item) for item in map(codec.encode_event, events_from_rows(chunk)))
            else:
                yield len(chunk), encode(chunk)


def _encode_rows(rows: Sequence[tuple[Any, ...]]) -> bytes:
    """The events of stored rows as the items of an SBS ``Array(Event)``: its encoding
    without the count."""
    return b"".join(map(codec.encode_event, events_from_rows(rows)))


def _encode_kept(rows: Sequence[tuple[Any, ...]]) -> bytes:
    """:func:`_encode_rows`, with each small row's encoding kept (an SBS array's items are
    its items' encodings one after the other)."""
    return b"".join(
        [_encoded_row(row) if _keep(row[_PAYLOAD]) else _encode_rows([row]) for row in rows]
    )


def _keep(payload: object) -> bool:
    """Whether a row with this payload has its encoding kept: a small one, as bytes (some
    drivers give views, which cannot be a key)."""
    return payload is None or (type(payload) is bytes and len(payload) <= _KEPT_PAYLOAD_BYTES)


@lru_cache(maxsize=ENCODED_ROWS_KEPT)
def _encoded_row(row: tuple[Any, ...]) -> bytes:
    return _encode_rows([row])


async def stream_body(plan: ReplyPlan) -> AsyncIterator[bytes]:
    """The body of a large planned reply, a piece at a time from its spool (each read in a
    thread: the file may not be in the page cache)."""
    assert plan.spool is not None
    yield codec.encode_integer(plan.count)
    while piece := await asyncio.to_thread(plan.spool.read, _PIECE_BYTES):
        yield piece
