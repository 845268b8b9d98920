"""An asyncio client of the Eventer protocol, for tidings' event server and hat-event 0.8.5.

The application's end of the event server: a module (not a package) that stands on the wire
and the event model alone, so a program that only talks to a server loads neither SQLAlchemy
nor PySpark; everything its calls take, return and raise is importable from here.

Events go in as :class:`~tidings.events.model.NewEvent` and come back as
:class:`~tidings.events.model.StoredEvent`, the store's own model, so code using the client
and code using the store directly read alike::

    async with await connect("tcp+sbs://127.0.0.1:23012", [("sensor", "*")]) as client:
        [stored] = await client.register_with_response([json_event(("sensor", "t1"), 21.5)])
        notified = await client.receive()
        latest = await client.query(QueryData(event_types=(("sensor", "*"),), max_results=10))

Events received from a server have ``position`` 0 (a position is local to a store) and no
outbox id, except that :meth:`Client.register_outbox` fills in the ids it sent.

A reply larger than the client's ``max_frame_bytes`` (64 MiB by default) fails its request
with :class:`ReplyTooLarge` (the connection stays open): a query without ``max_results``
is answered with every event it selects, in one message, as hat-event 0.8.5 does (its
protocol has no paging). :meth:`Client.query_pages` reads a large result in pages, the way
any hat-event 0.8.5 client can; :meth:`Client.query_latest_by_key` pages on its own.

Requests on one client are answered in the order they were sent. Notifications of a
subscription wait, up to a bound, until :meth:`Client.receive` takes them; a subscribing
client should keep receiving, or reading stops (replies included) and the server eventually
drops the client as a slow subscriber.
"""

from __future__ import annotations

import dataclasses
import json
import ssl
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, Self

from tidings.errors import (
    AccessDenied,
    ClientError,
    ConfigError,
    ConnectionClosed,
    ProtocolError,
    ReplyTooLarge,
    RequestTimeout,
    StoreError,
    TidingsError,
    TlsError,
)
from tidings.events import (
    EventId,
    EventType,
    NewEvent,
    Order,
    OrderBy,
    PayloadKind,
    QueryData,
    QueryType,
    StoredEvent,
    json_event,
    validate_query_type,
)
from tidings.wire import chatter, chatter_client, codec

#: Everything the client's calls take, return and raise, so a user needs no other import.
__all__ = [
    "AccessDenied",
    "Client",
    "ClientError",
    "ConfigError",
    "ConnectionClosed",
    "EventId",
    "EventType",
    "NewEvent",
    "Order",
    "OrderBy",
    "PayloadKind",
    "ProtocolError",
    "QueryData",
    "QueryType",
    "ReplyTooLarge",
    "RequestTimeout",
    "StoreError",
    "StoredEvent",
    "TidingsError",
    "TlsError",
    "connect",
    "json_event",
    "json_value",
]

#: Events per page of :meth:`Client.query_pages` unless told (about 1 MiB of small events).
DEFAULT_PAGE_EVENTS = 10_000
#: The bytes of events a page of :meth:`Client.query_latest_by_key` asks for at most (~65,000
#: row events): a frame is decoded whole before the next is read, and meanwhile the
#: server's ping waits unanswered (hat-event drops a peer after 20 s), so pages stay far
#: below that on a busy machine, not as large as the frame limit allows.
LATEST_PAGE_BYTES = 8 * 1024 * 1024
#: What a reply's frame holds besides its events (envelope, names, counts), kept free when
#: a page is bounded by the client's frame limit.
_REPLY_OVERHEAD_BYTES = 4096


async def connect(
    address: str,
    subscriptions: Sequence[tuple[str, ...]] = (),
    *,
    tls: chatter_client.ClientTls | ssl.SSLContext | None = None,
    max_frame_bytes: int = chatter.DEFAULT_MAX_FRAME_BYTES,
    ping_interval: float | None = chatter.DEFAULT_PING_INTERVAL,
    timeout: float = 10.0,
    request_timeout: float | None = None,
    identity: str | None = None,
    password: str | None = None,
) -> Client:
    """Connect to the Eventer server at ``address`` (``tcp+sbs://host:port``, or
    ``ssl+sbs://host:port`` for TLS).

    ``subscriptions`` are event types in which ``?`` stands for one segment and a final
    ``*`` for any number; if any are given they are subscribed at once (as hat-event's
    client does). ``timeout`` bounds connecting, ``request_timeout`` (None: no bound) each
    request with a reply (:class:`RequestTimeout` when it runs out).

    Over TLS the server's certificate is verified, against the system's CAs unless ``tls``
    names a CA file, and must name the address's host; ``tls`` also holds the client
    certificate a server with mutual TLS requires. It is a
    :class:`tidings.config.tls.TlsClientConfig` (the files are read again for each
    connection, so renewed ones are used) or a ready :class:`ssl.SSLContext`. A handshake that
    fails raises :class:`TlsError` saying why.

    ``identity`` and ``password`` log in (a tidings extension; the server's
    ``eventer_server.identities``), only over TLS or on loopback: a refused login raises
    :class:`AccessDenied` with the server's reason. A client certificate needs no login.
    """
    connection = await chatter_client.connect(
        address,
        tls=tls,
        max_frame_bytes=max_frame_bytes,
        ping_interval=ping_interval,
        timeout=timeout,
    )
    client = Client(connection, request_timeout)
    if identity is not None or password is not None:
        try:
            await client.login(identity or "", password or "")
        except BaseException:
            await client.aclose()
            raise
    if subscriptions:
        try:
            await client.subscribe(subscriptions)
        except BaseException:
            await client.aclose()
            raise
    return client


class Client:
    """A connection to an Eventer server; get one with :func:`connect`."""

    def __init__(self, connection: chatter.Connection, request_timeout: float | None) -> None:
        self._connection = connection
        self._request_timeout = request_timeout

    @property
    def is_open(self) -> bool:
        return self._connection.is_open

    async def login(self, identity: str, password: str) -> None:
        """Name this client to the server (a tidings extension; see :func:`connect`), as its
        first request; :class:`AccessDenied` with the server's reason if refused."""
        reply = await self._request(
            codec.TIDINGS_EVENTER, "MsgLoginReq", {"identity": identity, "password": password}
        )
        if (reply.module, reply.type) != (codec.TIDINGS_EVENTER, "MsgLoginRes"):
            raise ProtocolError(f"expected MsgLoginRes, got {reply.module}.{reply.type}")
        if not reply.data["success"]:
            raise AccessDenied(f"login as {identity!r} refused: {reply.data['message']}")

    async def register(self, events: Sequence[NewEvent]) -> None:
        """Register ``events`` as one session without waiting for the result.

        It returns once the request is handed to the socket (so a fast producer is held back
        by a slow server); a later request's reply means this one was handled.
        """
        self._connection.send(codec.EVENTER, "MsgRegisterReq", _register_items(events), last=True)
        await self._connection.drain()

    async def register_with_response(self, events: Sequence[NewEvent]) -> list[StoredEvent | None]:
        """Register ``events`` as one session; the stored event of each, None if it failed.

        An event fails alone if the server cannot store it (a ``?`` or ``*`` in its type, for
        example); all fail if a server module aborts the session.
        """
        reply = await self._request(codec.EVENTER, "MsgRegisterReq", _register_items(events))
        return _register_results(reply, len(events))

    async def register_outbox(self, events: Sequence[NewEvent]) -> list[StoredEvent | None]:
        """Register events that carry their outbox event id, stored once per id and type.

        A tidings extension: sending an id again yields the event stored the first time, not
        a new one. Every event must have ``outbox_event_id``. hat-event servers do not know
        the message and close the connection.
        """
        items = []
        for index, event in enumerate(events):
            if not isinstance(event, NewEvent) or not event.outbox_event_id:
                raise ClientError(f"register_outbox: event {index} has no outbox_event_id")
            item = {"outboxEventId": event.outbox_event_id, "event": _register_item(event, index)}
            items.append(item)
        reply = await self._request(codec.TIDINGS_EVENTER, "MsgRegisterReq", items)
        results = _register_results(reply, len(events))
        return [
            None if result is None else dataclasses.replace(result, outbox_event_id=sent)
            for result, sent in zip(results, (e.outbox_event_id for e in events), strict=True)
        ]

    async def query(self, query: QueryData | None = None) -> list[StoredEvent]:
        """The events ``query`` selects (default: all, newest first)."""
        if query is None:
            query = QueryData()
        if not isinstance(query, QueryData):
            raise ClientError(f"query must be a tidings QueryData, not {type(query).__name__}")
        reply = await self._request(codec.EVENTER, "MsgQueryReq", codec.query_to_sbs(query))
        _expect(reply, "MsgQueryRes")
        return codec.events_from_sbs(reply.data, "MsgQueryRes")

    async def query_pages(
        self, query: QueryData | None = None, page_events: int = DEFAULT_PAGE_EVENTS
    ) -> AsyncIterator[list[StoredEvent]]:
        """The events ``query`` selects (default: all, newest first), a page at a time.

        For results too large for one reply (:class:`ReplyTooLarge`) or for memory. Each
        page is a query of hat-event 0.8.5, so it works against hat-event servers too: the
        query with ``max_results`` and its time bound moved to the last page's last
        timestamp (bounds are inclusive, so the events at that timestamp come again and are
        skipped by id; a session's events share a timestamp, so a page asks for
        ``page_events`` more than it skips). ``query.max_results`` bounds the whole; pages
        are in the query's order, which must be by timestamp (events without a source
        timestamp cannot be paged by it), and ``unique_type`` is not paged (its result is
        one event per type). Events stored meanwhile past the last page's bound are
        included; pages are not one snapshot.
        """
        query = QueryData() if query is None else query
        if not isinstance(query, QueryData):
            raise ClientError(f"query must be a tidings QueryData, not {type(query).__name__}")
        if query.order_by != "timestamp" or query.unique_type:
            raise ClientError("query_pages: pages by timestamp, without unique_type")
        if isinstance(page_events, bool) or not isinstance(page_events, int) or page_events < 1:
            raise ClientError(f"query_pages: page_events must be a positive int: {page_events!r}")
        ascending = query.order == "ascending"
        bound: int | None = None
        seen: set[EventId] = set()  # the ids at ``bound`` already given
        left = query.max_results
        while left is None or left > 0:
            size = page_events + len(seen)
            if left is not None:
                size = min(size, left + len(seen))
            window = dataclasses.replace(query, max_results=size)
            if bound is not None and ascending:
                window = dataclasses.replace(window, t_from=bound)
            elif bound is not None:
                window = dataclasses.replace(window, t_to=bound)
            page = await self.query(window)
            fresh = [event for event in page if event.id not in seen]
            if left is not None:
                fresh = fresh[:left]
                left -= len(fresh)
            if fresh:
                yield fresh
            if len(page) < size:
                return
            last = page[-1].timestamp_us
            if last != bound:
                bound, seen = last, set()
            seen.update(event.id for event in page if event.timestamp_us == last)

    async def query_latest_by_key(self, event_type: Sequence[str]) -> list[StoredEvent]:
        """The newest event of each key among the JSON events of ``event_type`` (exact), in
        the server's order: the key is the payload's ``key`` (or its CloudEvents ``data``'s),
        as in the row-change events of :mod:`tidings.intermediary.views.rows`.

        Read in pages of at most :data:`LATEST_PAGE_BYTES` that fit this client's
        ``max_frame_bytes``, each continuing after the last event of the one before, until
        one is empty. A key changed during a load of
        several pages comes again with its newer event in a later page: fold the events in
        order. A tidings extension; hat-event servers do not know the message and close the
        connection."""
        try:
            checked = list(validate_query_type(tuple(event_type)))
        except (StoreError, TypeError) as exc:
            raise ClientError(f"query_latest_by_key: {exc}") from exc
        if "?" in checked or "*" in checked:
            raise ClientError(f"query_latest_by_key: expected an exact type, got {checked}")
        limit = self._connection.max_frame_bytes - _REPLY_OVERHEAD_BYTES
        max_bytes = max(1, min(limit, LATEST_PAGE_BYTES))
        events: list[StoredEvent] = []
        last: EventId | None = None
        while True:
            request = codec.latest_by_key_request_to_sbs(checked, last, max_bytes)
            reply = await self._request(codec.TIDINGS_EVENTER, "MsgLatestByKeyReq", request)
            _expect(reply, "MsgQueryRes")
            page = codec.events_from_sbs(reply.data, "MsgQueryRes")
            if not page:
                return events
            events += page
            last = page[-1].id

    async def subscribe(self, types: Sequence[tuple[str, ...]]) -> None:
        """Replace the subscription: from now on :meth:`receive` gets events of ``types``.

        An empty ``types`` subscribes to nothing.
        """
        checked: list[list[str]] = []
        for query_type in types:
            try:
                checked.append(list(validate_query_type(tuple(query_type))))
            except (StoreError, TypeError) as exc:
                raise ClientError(f"subscribe: {exc}") from exc
        self._connection.send(codec.EVENTER, "MsgSubscribe", checked, last=True)
        await self._connection.drain()

    async def receive(self) -> list[StoredEvent]:
        """The events of the next notification (one stored session's matching events).

        Raises :class:`ConnectionClosed` once the connection is closed.
        """
        message = await self._connection.receive()
        if (message.module, message.type) != (codec.EVENTER, "MsgNotify"):
            reason = f"unexpected message {message.module}.{message.type} from the server"
            self._connection.close(reason)
            raise ProtocolError(reason)
        return codec.events_from_sbs(message.data, "MsgNotify")

    async def aclose(self) -> None:
        """Close the connection (pending requests fail with :class:`ConnectionClosed`)."""
        await self._connection.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _request(self, module: str, type_name: str, value: codec.Value) -> chatter.Message:
        return await self._connection.request(
            module, type_name, value, timeout=self._request_timeout
        )


def json_value(event: StoredEvent | NewEvent) -> Any:
    """The decoded JSON payload of ``event``; a ClientError if it has none."""
    if event.payload_kind is not PayloadKind.JSON or event.payload is None:
        raise ClientError(f"event {event.type} has no JSON payload ({event.payload_kind})")
    return json.loads(event.payload)


def _register_items(events: Sequence[NewEvent]) -> list[codec.Value]:
    return [_register_item(event, index) for index, event in enumerate(events)]


def _register_item(event: NewEvent, index: int) -> codec.Value:
    """The wire ``RegisterEvent`` of ``event``, refusing what the wire cannot carry (it would
    otherwise drop a payload without a kind silently)."""
    if not isinstance(event, NewEvent):
        raise ClientError(f"event {index}: expected a NewEvent, got {type(event).__name__}")
    if (event.payload is None) != (event.payload_kind is None):
        raise ClientError(f"event {index}: payload and payload_kind must be set together")
    try:
        return codec.register_event_to_sbs(event)
    except Exception as exc:  # a JSON payload not UTF-8, an SBS one not Hat.Data (hat-sbs's
        # C decoder reports that as SystemError, among others)
        raise ClientError(f"event {index}: cannot encode its payload: {exc}") from exc


def _register_results(reply: chatter.Message, expected: int) -> list[StoredEvent | None]:
    _expect(reply, "MsgRegisterRes")
    results = codec.register_results_from_sbs(reply.data)
    if len(results) != expected:
        raise ProtocolError(f"MsgRegisterRes: {len(results)} results for {expected} events")
    return results


def _expect(reply: chatter.Message, type_name: str) -> None:
    if (reply.module, reply.type) != (codec.EVENTER, type_name):
        raise ProtocolError(
            f"expected {codec.EVENTER}.{type_name}, got {reply.module}.{reply.type}"
        )
