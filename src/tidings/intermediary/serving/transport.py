"""Serving an intermediary's subscribers over WebSocket ([84]-[88], [146]).

One Starlette WebSocket endpoint. A subscriber sends JSON text requests::

    {"op": "subscribe", "key": "k", "region": {...}, "priority": 0, "rate_hz": 10,
     "capabilities": {...}}
    {"op": "unsubscribe", "key": "k"}

and gets, in order, one JSON reply per request (``{"op": "subscribed", "key", "covered",
"from_epoch"}``, ``{"op": "unsubscribed", "key", "removed"}`` or ``{"op": "error",
"message"}``; a bad request is answered and the connection goes on, one that fails
unexpectedly too, logged once per place it failed at) and binary messages,
one per frame: a one-byte key length, the key (UTF-8) and the frame (:mod:`.generation`'s
layout). The first message is ``{"op": "hello", "subscriber": <id>, "identity": <name>}``
(with ``"stale": {upstream: reason}`` while an upstream is lost). The same server
serves the web page of one subscriber's live view (:mod:`.page`: ``GET /view``).

Who may connect is decided before the WebSocket upgrade (:mod:`.access`): the handshake
carries a token or a user and password (:mod:`.credentials`), or none, and a refusal is an
HTTP 401 with the reason as its body; the connection keeps the :class:`~.views.grants.Grant`
of the identity it proved, and a subscription the grant does not allow is answered with an
error naming the identity and what was refused, while the connection goes on. With ``tls``
(an :class:`ssl.SSLContext`) the socket and the pages are served over TLS only; a client
that does not speak TLS to it fails its own handshake and harms no other.

Slow subscribers never hold the others ([146]): each connection (:mod:`.connection`) has one
outgoing slot holding the latest round's frames; a writer task per connection empties it (a
round sends to an idle connection itself, and leaves a send that must wait for the transport
to the writer). While the slot is full or being sent, the scheduler is told the channel is
not ready, so the subscriber's frames are dropped (and counted) instead of queued; after the
scheduler's ``max_dropped`` in a row the connection is closed with
:data:`.envelope.DROPPED_CLOSE_CODE` and the scheduler's reason.
Request messages are bounded in size (uvicorn refuses a bigger frame with 1009) and in rate
(a token bucket per connection; a request over it is refused with an error reply:
:mod:`.requests`). Connections are bounded per server (``max_connections``, close code 1013)
and per client address (``max_connections_per_address``: at TCP accept, before any TLS byte,
by :mod:`tidings.accept`, which also closes a client silent on the TLS port after
``tls_handshake_timeout_s``; and again from before the WebSocket handshake, so before any
password is hashed: :mod:`.addresses`). Every refusal is counted by reason in
:attr:`IntermediaryServer.counters` (:mod:`.counters`), which :mod:`.metrics` exports.

A background loop runs at ``tick_s``: it asks ``source`` for the upstream batches that
arrived, applies them and ends the epoch if there were any (numbered with the publisher's
tick when the batches carry one), then runs one generation round. With ``tick_s`` None there
is no loop: the owner (a cluster stepping several intermediaries together) calls
:meth:`IntermediaryServer.ingest` and :meth:`IntermediaryServer.serve` itself. Messages the
server pushes unasked (:meth:`IntermediaryServer.notify`) go out after the frames already
offered to that connection, in order.
Everything runs on the server's event loop but a round's frames, generated in a thread
while the loop serves on (:meth:`.Intermediary.plan_round`; without the loop, ``serve``
generates them itself), and SQL views' evaluation (:mod:`.eventviews`' workers).

With ``views`` (an :class:`~.eventviews.EventViews` over the event server), a subscribe
request may carry ``"events": [pattern, ...]`` or ``"sql": "SELECT ..."`` instead of
``"region"`` (exactly one of the three). Those subscriptions get JSON text messages
(``{"op": "event", "key", ...}``, ``{"op": "view", "key", ...}``, see :mod:`.eventviews`).
Events are a stream and are not dropped: each is appended once to one ring the connections
read with a cursor each (:mod:`.ring`), so an event costs the loop O(1) whoever subscribed
and a subscriber that never reads costs O(1) a tick; the ring holds ``max_queued_messages``
from earlier ticks and ``max_queued_bytes``, and a subscriber that falls off its start and
loses an event of its own is closed with :data:`.envelope.DROPPED_CLOSE_CODE` and a reason
(:func:`.connection.catch_up`). A view is a latest value: per key, a view message
not sent yet is replaced by the next one (counted like a replaced frame). A key names one
subscription whatever its kind: a subscribe replaces the key's previous subscription of any
kind.

With ``upstreams`` (each upstream's name -> its :class:`~tidings.intermediary.staleness.Staleness`),
every loss of an upstream and every return is announced to every connection after the
tick's messages, a loss ridden out between two ticks included
(:func:`.envelope.status_message`: ``{"op": "status", "upstream", "stale", "reason"}``, in
the ring, so in order with the events);
meanwhile the subscribers are served the last state and keep their subscriptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from tidings.accept import AcceptRules
from tidings.errors import IntermediaryError, SubscriptionRefused
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.generation import Frame
from tidings.intermediary.node.intermediary import (
    MAX_KEY_BYTES,
    Intermediary,
    RoundPlan,
    Served,
)
from tidings.intermediary.regions.geometry import parse_region
from tidings.intermediary.serving.access import Gatekeeper
from tidings.intermediary.serving.addresses import AddressSlots
from tidings.intermediary.serving.announcer import StatusAnnouncer, Upstreams
from tidings.intermediary.serving.connection import Connection, catch_up
from tidings.intermediary.serving.counters import Disconnect, ServingCounters
from tidings.intermediary.serving.credentials import SUBPROTOCOL
from tidings.intermediary.serving.envelope import (
    DROPPED_CLOSE_CODE,
    FULL_CLOSE_CODE,
    clip_reason,
)
from tidings.intermediary.serving.limits import TransportLimits as TransportLimits
from tidings.intermediary.serving.page import page_routes
from tidings.intermediary.serving.requests import count_close, error, parse
from tidings.intermediary.serving.ring import EventRing
from tidings.intermediary.views.grants import NOTHING, Grant
from tidings.logs import OncePerCause
from tidings.serving import DenyingWebSockets, listen, serve_guarded
from tidings.tasks import stop_task

if TYPE_CHECKING:
    from tidings.intermediary.views.eventviews import EventViews
    from tidings.intermediary.views.messages import Outgoing

log = logging.getLogger(__name__)


class IntermediaryServer:
    """An :class:`Intermediary` served over WebSocket; :meth:`start`, then :meth:`aclose`."""

    def __init__(
        self,
        intermediary: Intermediary,
        *,
        source: Callable[[], Sequence[UpdateBatch]] | None = None,
        tick_s: float | None = 0.02,
        budget: int = 1000,
        limits: TransportLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        views: EventViews | None = None,
        upstreams: Upstreams | None = None,
        access: Gatekeeper | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.intermediary = intermediary
        #: Who may connect (default: anonymous clients from this machine, granted all).
        self.access = access or Gatekeeper.from_config()
        self.tls = tls
        #: Each upstream's name -> its staleness, asked every tick.
        self.upstreams = upstreams
        self.views = views
        self.source = source
        self.tick_s = tick_s
        self.budget = budget
        self.limits = limits or TransportLimits()
        self.clock = clock
        self.connections: dict[int, Connection] = {}
        #: The events and status messages every connection reads from (:mod:`.ring`).
        self.ring = EventRing(self.limits.max_queued_messages, self.limits.max_queued_bytes)
        #: Tells every connection, through the ring, of each upstream lost or back.
        self.announcer = StatusAnnouncer(self.ring, upstreams)
        #: Totals since the start (refusals by reason, frames sent...), for metrics.
        self.counters = ServingCounters()
        #: Connections held per client address.
        self.addresses = AddressSlots(self.limits.max_connections_per_address)
        #: The latest connections closed by the server, with why (bounded, for metrics).
        self.disconnects: deque[Disconnect] = deque(maxlen=1000)
        self.app = Starlette(
            routes=[WebSocketRoute("/", self._endpoint), *page_routes(intermediary, self.access)]
        )
        self._next_id = 0
        #: A request's unexpected failure is logged once per place, not once per request.
        self._problems = OncePerCause(log)
        self._server: uvicorn.Server | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        #: The round the loop's tick generated off the loop, for :meth:`serve` to finish.
        self._generated: tuple[RoundPlan, list[Frame]] | None = None
        self.port = 0

    @property
    def scheme(self) -> str:
        """``wss`` when served over TLS, else ``ws``."""
        return "ws" if self.tls is None else "wss"

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (0: any free port, see :attr:`port`) and start the loop;
        returns once connections are accepted. A port in use is an error here."""
        try:
            sock = listen(host, port, self.limits.send_buffer_bytes)
        except OSError as exc:
            raise IntermediaryError(
                f"transport: cannot listen on {host}:{port}: {exc.strerror}"
            ) from None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_config=None,
            access_log=False,
            lifespan="off",
            ws=DenyingWebSockets,
            ws_max_size=self.limits.max_message_bytes,
            ws_per_message_deflate=False,
            proxy_headers=False,
            ssl_context_factory=None if self.tls is None else self._tls_context,
        )
        timeout = self.limits.tls_handshake_timeout_s
        rules = AcceptRules(
            self.limits.max_connections_per_address, None if self.tls is None else timeout
        )
        self._server, self._serve_task = serve_guarded(
            config, sock, rules, timeout, self._refused_at_accept
        )
        while not self._server.started:
            if self._serve_task.done():
                self._serve_task.result()
                raise IntermediaryError(f"transport: the server on {host}:{port} did not start")
            await asyncio.sleep(0.01)
        if self.tick_s is not None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run(self.tick_s))

    def _refused_at_accept(self, reason: str, address: str) -> None:
        """A connection closed by :mod:`tidings.accept` before uvicorn saw it: counted."""
        self.counters.refusals[reason] += 1

    def _tls_context(
        self, config: uvicorn.Config, default: Callable[[], ssl.SSLContext]
    ) -> ssl.SSLContext:
        """uvicorn's TLS context: the one given (not one uvicorn builds from files)."""
        assert self.tls is not None
        return self.tls

    async def aclose(self) -> None:
        """Stop the loop, then stop accepting and close every connection."""
        if self._loop_task is not None:
            await stop_task(self._loop_task)
        if self._server is not None and self._serve_task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(self.limits.close_timeout_s):
                    await self._serve_task
        if self.views is not None:
            self.views.close()

    # -- the loop ----------------------------------------------------------------------

    async def _run(self, tick_s: float) -> None:
        """:meth:`step` each tick, the frames generated in a thread meanwhile."""
        while True:
            try:
                self.ingest()
                plan = self.intermediary.plan_round(self.clock(), self.budget)
                made = await asyncio.to_thread(plan.generate) if plan.views else []
                self._generated = (plan, made)
                self.serve()
            except Exception:  # one bad tick must not stop serving everyone
                log.exception("intermediary tick failed")
            await asyncio.sleep(tick_s)

    def step(self) -> None:
        """One tick: upstream batches -> epoch; one round; disconnect reported subscribers."""
        self.ingest()
        self.serve()

    def ingest(self) -> None:
        """Apply the upstream batches that arrived and end the epoch if there were any (at
        the latest publisher tick they carry, if they carry one)."""
        batches = self.source() if self.source is not None else ()
        if batches:
            for batch in batches:
                self.intermediary.apply(batch)
            ticks = [batch.tick for batch in batches if batch.tick is not None]
            self.intermediary.end_epoch(max(ticks) if ticks else None)

    def serve(self) -> int:
        """One generation round; disconnect the subscribers the scheduler reported. Returns
        the number of frames generated."""
        generated, self._generated = self._generated, None
        if generated is None:
            round_ = self.intermediary.round(self.clock(), self.budget)
        else:  # the loop's tick: generated in a thread already
            round_ = self.intermediary.finish_round(*generated)
        by_subscriber: dict[object, list[Served]] = {}
        for served in round_:
            by_subscriber.setdefault(served.subscriber, []).append(served)
        for subscriber, items in by_subscriber.items():
            conn = self.connections.get(subscriber)  # type: ignore[call-overload]
            if conn is not None:
                self._offer(conn, items)
        kicks = self.intermediary.take_disconnects()
        back = self.announcer.before_tick()
        if self.views is not None:
            self._queue(self.views.step(self.clock(), self.budget))
        self.announcer.after_tick(back)
        kicks += catch_up(self.connections, self.ring)
        for subscriber, reason in kicks:
            conn = self.connections.get(subscriber)  # type: ignore[call-overload]
            if conn is not None and not conn.kicked.is_set():
                conn.reason = reason
                conn.kicked.set()
        return len(round_)

    def notify(self, subscriber: int, message: dict[str, object]) -> bool:
        """Push ``message`` (JSON) to ``subscriber`` after every frame already offered to it;
        False if it is not connected."""
        conn = self.connections.get(subscriber)
        if conn is None:
            return False
        conn.notices.append(json.dumps(message))
        conn.wake.set()
        return True

    def _queue(self, messages: list[Outgoing]) -> None:
        """A tick's JSON messages: events to the ring (once each, whoever they are for),
        views to their connections."""
        ring = self.ring
        for message in messages:
            if isinstance(message, tuple):
                conn = self.connections.get(message[0])  # type: ignore[call-overload]
                if conn is not None and not conn.kicked.is_set():
                    conn.queue(message[1])
            else:
                ring.append(message.body, message.route)

    def _offer(self, conn: Connection, items: list[Served]) -> None:
        """Put a round's frames in the slot (latest wins; replaced ones count as dropped)."""
        if conn.slot is not None:
            conn.replaced += 1
            self.counters.replaced += 1
        conn.slot = items
        self.intermediary.set_ready(conn.id, False)
        if conn.idle and not conn.wake.is_set() and conn.send_now():
            self.intermediary.set_ready(conn.id, True)
            return
        conn.wake.set()

    # -- connections -------------------------------------------------------------------

    async def _endpoint(self, websocket: WebSocket) -> None:
        address = websocket.client.host if websocket.client is not None else None
        if not self.addresses.take(address):  # before the handshake: no password hashed
            self.counters.refusals["too_many_from_address"] += 1
            await self._refuse(websocket, self.addresses.refusal(address))
            return
        try:
            grant = await self.access.handshake(websocket)
            if grant is not None:
                await self._connected(websocket, grant)
        finally:
            self.addresses.give_back(address)

    async def _refuse(self, websocket: WebSocket, reason: str) -> None:
        """Close with 1013 and ``reason``: accepted first so the client reads a close code
        and reason, not a bare 403."""
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        await websocket.close(FULL_CLOSE_CODE, clip_reason(reason))

    async def _connected(self, websocket: WebSocket, grant: Grant) -> None:
        if len(self.connections) >= self.limits.max_connections:
            self.counters.refusals["too_many_connections"] += 1
            await self._refuse(websocket, "too many connections")
            return
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        self._next_id += 1
        conn = Connection(
            self._next_id,
            websocket,
            grant,
            tokens=float(self.limits.burst),
            refilled=self.clock(),
            counters=self.counters,
            ring=self.ring,
            cursor=self.ring.end,
        )
        self.connections[conn.id] = conn
        ready = functools.partial(self.intermediary.set_ready, conn.id, True)
        writer = asyncio.create_task(conn.write(ready))
        reader = asyncio.create_task(self._reader(conn))
        kicked = asyncio.create_task(conn.kicked.wait())
        try:
            hello: dict[str, object] = {
                "op": "hello",
                "subscriber": conn.id,
                "identity": grant.identity,
            }
            if self.announcer.told:
                hello["stale"] = dict(self.announcer.told)
            await websocket.send_text(json.dumps(hello))
            await asyncio.wait({reader, writer, kicked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, writer, kicked):
                task.cancel()
            for task in (reader, writer, kicked):
                with contextlib.suppress(BaseException):
                    await task
            self.connections.pop(conn.id, None)
            self.intermediary.unsubscribe(conn.id)
            if self.views is not None:
                await self.views.unsubscribe(conn.id)
        if conn.kicked.is_set():
            reason = clip_reason(conn.reason or "too many frames dropped")
            self.disconnects.append(Disconnect(conn.id, DROPPED_CLOSE_CODE, reason))
            self.counters.subscribers_dropped += 1
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                async with asyncio.timeout(self.limits.close_timeout_s):
                    await websocket.close(DROPPED_CLOSE_CODE, reason)

    async def _reader(self, conn: Connection) -> None:
        while True:
            message = await conn.websocket.receive()
            if message["type"] == "websocket.disconnect":
                count_close(message, self.counters)
                return
            request = parse(conn, message, self.limits, self.clock(), self.counters)
            reply = request[0] if isinstance(request, tuple) else await self._handle(conn, request)
            await conn.websocket.send_text(json.dumps(reply))

    async def _handle(self, conn: Connection, request: dict[str, Any]) -> dict[str, object]:
        refusals = self.counters.refusals
        try:
            return await self.handle_request(conn.id, request)
        except IntermediaryError as exc:
            message = str(exc)
            refused = isinstance(exc, SubscriptionRefused)  # the client raises it as one
            refusals["not_granted" if refused else "invalid"] += 1
        except RecursionError:  # the request's nesting, met past parsing
            message, refused = "request: JSON nested too deeply", False
            refusals["too_deep"] += 1
        except Exception as exc:  # a bug this request met: answered, logged once per place
            self._problems.failure("intermediary: a request failed", exc)
            message, refused = "request: failed (the intermediary's log says why)", False
        reply = error(message)
        if refused:
            reply["refused"] = True
        key = request.get("key")
        if isinstance(key, str) and len(key) <= MAX_KEY_BYTES:
            reply["key"] = key
        return reply

    async def handle_request(
        self, subscriber: int, request: dict[str, object]
    ) -> dict[str, object]:
        """The reply to one parsed request of ``subscriber`` (an :class:`IntermediaryError`
        becomes an error reply); a subclass adds operations here. ``subscribed`` says from
        which epoch on the subscription's frames see everything its upstream brings
        (``from_epoch``: the next one)."""
        op, key = request.get("op"), request.get("key")
        if op == "subscribe":
            unknown = sorted(set(request) - _SUBSCRIBE_FIELDS)
            if unknown:
                raise IntermediaryError(f"request.{unknown[0]}: unknown field")
            kinds = [k for k in ("region", "events", "sql") if k in request]
            if len(kinds) != 1:
                raise IntermediaryError(
                    "subscribe: expected exactly one of region, events and sql, got "
                    + (", ".join(kinds) or "none")
                )
            if kinds != ["region"]:
                return await self._subscribe_views(subscriber, request, key)
            self.check_region(subscriber, request.get("region"))
            outcome = self.intermediary.subscribe(
                subscriber,
                key,  # type: ignore[arg-type]
                request.get("region"),
                request.get("priority", 0.0),  # type: ignore[arg-type]
                request.get("rate_hz", 10.0),  # type: ignore[arg-type]
                request.get("capabilities"),
            )
            if self.views is not None and key in self.views.subscriptions(subscriber):
                await self.views.unsubscribe(subscriber, key)  # type: ignore[arg-type]
            return {
                "op": "subscribed",
                "key": key,
                "covered": outcome.covered,
                "from_epoch": self.intermediary.state.epoch + 1,
            }
        if op == "unsubscribe":
            if not isinstance(key, str):
                raise IntermediaryError("key: expected a string")
            removed = self.intermediary.unsubscribe(subscriber, key)
            if self.views is not None:
                removed += await self.views.unsubscribe(subscriber, key)
            return {"op": "unsubscribed", "key": key, "removed": removed}
        raise IntermediaryError(f"op: expected 'subscribe' or 'unsubscribe', got {str(op)[:40]!r}")

    async def _subscribe_views(
        self, subscriber: int, request: dict[str, Any], key: object
    ) -> dict[str, object]:
        """An ``events`` or ``sql`` subscription (they take no capabilities, and events, a
        stream, no rate or priority); it replaces a spatial one of the same key."""
        if self.views is None:
            raise IntermediaryError("subscribe: this intermediary serves regions only")
        if "capabilities" in request:
            raise IntermediaryError("capabilities: only a region subscription takes them")
        if "events" in request and ("rate_hz" in request or "priority" in request):
            raise IntermediaryError(
                "events: a stream of events takes no rate_hz or priority (every event is sent)"
            )
        was_covered = await self.views.subscribe(
            subscriber,
            key,  # type: ignore[arg-type]
            events=request.get("events"),
            sql=request.get("sql"),
            priority=request.get("priority", 0.0),
            rate_hz=request.get("rate_hz", 10.0),
            grant=self.grant_of(subscriber),
        )
        self.intermediary.unsubscribe(subscriber, key)  # type: ignore[arg-type]
        return {"op": "subscribed", "key": key, "covered": was_covered}

    def grant_of(self, subscriber: int) -> Grant:
        """What ``subscriber`` may subscribe to (nothing, if it is not connected)."""
        conn = self.connections.get(subscriber)
        return NOTHING if conn is None else conn.grant

    def check_region(self, subscriber: int, spec: object) -> None:
        """Refuse a region ``subscriber``'s grant does not allow (or that is no region),
        naming its identity and the region."""
        self.grant_of(subscriber).check_region(parse_region(spec))


_SUBSCRIBE_FIELDS = frozenset(
    {"op", "key", "region", "events", "sql", "priority", "rate_hz", "capabilities"}
)
