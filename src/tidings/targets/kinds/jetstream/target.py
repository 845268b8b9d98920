"""The JetStream target: publishing outbox events to one stream through nats-py.

The relay calls :meth:`JetStreamTarget.publish` synchronously from Spark executor tasks
running in plain threads, while nats-py is asyncio-only. The target therefore owns one
private event loop in a daemon thread (:mod:`tidings.targets.loop_thread`) and hands it
coroutines; every calling thread shares that loop and its single connection, which is what
lets one call pipeline thousands of publishes over one socket.

Delivery is at-least-once made effectively-once by JetStream: each message carries the
event id as ``Nats-Msg-Id``, so a batch replayed after a crash is acknowledged as a
duplicate inside the stream's ``duplicate_window`` instead of being stored twice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
import time
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from tidings.errors import TargetCallFailed, TargetError, TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.redaction import hide_url_credentials
from tidings.targets.base import Target
from tidings.targets.destination import RenderError
from tidings.targets.kinds.jetstream.calls import Call, key_runs, not_sent
from tidings.targets.kinds.jetstream.config import JetStreamTargetConfig
from tidings.targets.kinds.jetstream.messages import (
    AckInbox,
    ack_error,
    describe,
    header_block_size,
    message_headers,
    subject_template,
    subject_token,
)
from tidings.targets.kinds.jetstream.security import security_options, tls_context
from tidings.targets.kinds.jetstream.stream import ensure_stream
from tidings.targets.loop_thread import LoopThread

if TYPE_CHECKING:  # nats-py is imported where a connection is made: a process that only
    # validates configurations (every Spark worker does) does not load it.
    from nats.aio.client import Client
    from nats.aio.msg import Msg

_log = logging.getLogger("tidings.targets.kinds.jetstream")

#: What a NATS server allows when it does not say otherwise (its ``max_payload`` default).
DEFAULT_MAX_PAYLOAD = 1024 * 1024
#: Bytes the target's own headers can take at most (emit bounds the type, key, correlation id
#: and version), so a message without custom headers that is this far under the limit fits.
_OWN_HEADERS_BOUND = 8 * 1024
#: How long a producer that could not learn the server's limit uses the default before asking
#: again (asking costs a connection attempt).
_LIMIT_RETRY_S = 30.0


class JetStreamTarget(Target):
    """Publishes events to one JetStream stream; connects lazily, reconnects after failures.

    nats-py's own reconnection is disabled on purpose: while it reconnects it buffers
    publishes and replays them later, after this target has already reported them failed.
    Instead a lost connection is simply dropped, and the next :meth:`publish` opens a new one
    (and ensures the stream again, which also heals a server that lost its storage).
    """

    atomic = False
    #: A key's events go one after another within a call (see :meth:`_publish`); a run is
    #: bounded so that one call of a long run still returns within seconds.
    events_per_key = 1000
    config_model = JetStreamTargetConfig

    def __init__(self, name: str, config: JetStreamTargetConfig) -> None:
        super().__init__(name)
        self.config = config
        self._ack_timeout = config.ack_timeout.total_seconds()
        self._subjects: dict[str, str] = {}
        self._template = (
            subject_template(config.subject_template) if config.subject_template else None
        )
        self._stream_needs = config.stream_needs()
        self._tls: ssl.SSLContext | None = None
        self._inbox: AckInbox | None = None
        self._connect_lock = asyncio.Lock()
        self._last_error: Exception | None = None
        self._max_payload: int | None = None  # as the server announced it on connect
        self._limit_unknown_until = 0.0
        self._closed = False
        self._runner = LoopThread(f"tidings-jetstream-{name}")
        # A safety net for the calling thread only: each step of a call has its own bound
        # (two connect tries per server, a few stream API requests, one ack deadline).
        self._call_timeout = (2 * len(config.servers) + 4) * self._ack_timeout

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """Publish all ``events`` concurrently; None per acked (or duplicate) event, else why."""
        if self._closed:
            raise TargetError(f"jetstream target {self.name!r} is closed")
        if not events:
            return []
        # A key's events go one ack after another: each may take up to ack_timeout (the
        # call's own deadline ends it sooner when acks stop coming at all).
        runs = key_runs(events)
        timeout = self._call_timeout + (max(map(len, runs)) - 1) * self._ack_timeout
        try:
            return self._runner.run(self._publish(events, runs), timeout)
        except concurrent.futures.TimeoutError:
            raise TargetCallFailed(
                f"jetstream target {self.name!r}: no result within {timeout:g}s"
            ) from None

    def refusal(self, event: OutboxEvent) -> str | None:
        """The event has no subject (its ``subject_template`` cannot be filled from it), or
        the message is larger than the server's ``max_payload`` (payload + headers).

        A producer that has not connected yet learns the limit with one bounded connect;
        if the server cannot be reached it assumes NATS's default and asks again later.
        """
        try:
            subject = self._subject(event)
        except RenderError as exc:
            return self._no_subject(event, exc)
        body, headers = event.payload.encode(), message_headers(event)
        return self._oversize(event, subject, self._limit(), body, headers)

    def close(self) -> None:
        """Drain the connection (flushing what was sent) and stop the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._disconnect(), self._call_timeout)
        except concurrent.futures.TimeoutError:
            _log.warning("jetstream target %s: drain did not finish", self.name)
        self._runner.stop()

    # -- one call ------------------------------------------------------------------------

    async def _publish(
        self, events: Sequence[OutboxEvent], runs: list[deque[int]]
    ) -> list[str | None]:
        """Send every event, a key's events (``runs``) one after another; collect the acks.

        The first event of every ordering key leaves at once (nothing awaited while sending
        yields to the loop unless nats-py's write buffer fills, so they go in a few socket
        writes); each later event of a key leaves as soon as the one before it is
        acknowledged, so a key's events are stored in call order and none is sent after
        one of them failed (those get :func:`not_sent`). The wait ends when every sent
        event is acknowledged, the connection is lost, or no ack came for ``ack_timeout``.

        A server that stops acknowledging in the middle of a call (after some acks came) is
        not a fault of the events still in flight: the call fails as a whole with what was
        confirmed (TargetCallFailed), so the relay narrows it down and charges no event
        unless one is still refused alone.
        """
        try:
            inbox = await self._connection()
        except TargetError as exc:
            raise TargetUnavailable(f"jetstream target {self.name!r}: {exc}") from None
        call = Call(events, runs, inbox)
        try:
            for run in call.runs:
                await self._send_next(call, run)
            stalled = await self._follow_acks(call)
        finally:
            # Acks still missing now (all of them if the call was abandoned) are given up.
            for reply in call.replies:
                inbox.forget(reply)
        missing = f"no ack within {self._ack_timeout:g}s"
        for index, (subject, run) in list(call.in_flight.items()):
            self._fail(call, index, run, self._error(subject, missing))
        results = call.results
        if stalled and call.settled:
            raise TargetCallFailed(
                f"jetstream target {self.name!r}: the server stopped acknowledging during "
                f"the call ({call.settled} of {len(call.acks)} acks came, then none for "
                f"{self._ack_timeout:g}s)",
                confirmed=[result is None for result in results],
            )
        if any(results):
            await self._blame_the_server(inbox, call.acks, results)
        return results

    async def _follow_acks(self, call: Call) -> bool:
        """Settle acks as they arrive, sending each key's next event, until none is in flight
        or the connection is lost; True if it stopped because no ack came for
        ``ack_timeout`` while events were in flight."""
        lost = call.inbox.lost
        watcher = asyncio.ensure_future(lost.wait())
        watcher.add_done_callback(lambda _: call.wake())
        try:
            while call.in_flight:
                if not call.arrived:
                    if lost.is_set():
                        return False
                    if not await call.next_wake(self._ack_timeout) and not call.arrived:
                        return True
                while call.arrived:
                    index, ack = call.arrived.popleft()
                    call.settled += 1
                    subject, run = call.in_flight.pop(index)
                    cause = ack_error(ack.result(), self.config.stream)
                    if cause is None:
                        await self._send_next(call, run)
                    else:
                        self._fail(call, index, run, self._error(subject, cause))
            return False
        finally:
            watcher.cancel()

    async def _send_next(self, call: Call, run: deque[int]) -> None:
        """Send the next event of ``run`` (one key's events, in call order), if any; one that
        cannot be sent fails here and ends its run."""
        if not run:
            return
        index = run.popleft()
        event = call.events[index]
        try:
            subject = self._subject(event)
        except RenderError as exc:
            self._fail(call, index, run, self._no_subject(event, exc))
            return
        body, headers = event.payload.encode(), message_headers(event)
        refused = self._oversize(event, subject, call.inbox.nc.max_payload, body, headers)
        if refused is not None:
            self._fail(call, index, run, refused)
            return
        reply, ack = call.inbox.expect()
        call.replies.append(reply)
        try:
            await call.inbox.nc.publish(subject, body, reply=reply, headers=headers)
        except Exception as exc:
            self._fail(call, index, run, self._error(subject, describe(exc)))
            return
        call.acks.append(ack)
        call.in_flight[index] = (subject, run)
        ack.add_done_callback(partial(call.ack_arrived, index))

    def _fail(self, call: Call, index: int, run: deque[int], error: str) -> None:
        """Event ``index`` failed with ``error``; the rest of its key's run is not sent."""
        call.results[index] = error
        while run:
            call.results[run.popleft()] = not_sent(call.events[index])

    async def _blame_the_server(
        self, inbox: AckInbox, acks: list[asyncio.Future[Msg]], results: list[str | None]
    ) -> None:
        """Raise if the server, not the messages, is why acks are missing.

        A server that went away during the call (it cannot be reached again) or that
        acknowledged none of the messages in time is down: no message is to blame, so the
        relay must not charge them a retry (TargetUnavailable). Resending what it may have
        stored is safe: the stream drops duplicates by ``Nats-Msg-Id``. A connection closed
        by a server that is still there may be one message's fault (TargetCallFailed: the
        relay narrows the call down to it).
        """
        if not inbox.nc.is_connected:
            cause = describe(self._last_error) if self._last_error else "connection closed"
            try:
                await self._connection()
            except TargetError as exc:
                raise TargetUnavailable(
                    f"jetstream target {self.name!r}: the server went away during the call "
                    f"({cause}) and {exc}"
                ) from None
            raise TargetCallFailed(
                f"jetstream target {self.name!r}: the server closed the connection during "
                f"the call ({cause})",
                confirmed=[r is None for r in results],
            )
        if acks and not any(ack.done() for ack in acks):
            raise TargetUnavailable(
                f"jetstream target {self.name!r}: the server acknowledged none of "
                f"{len(acks)} messages within {self._ack_timeout:g}s"
            )

    def _limit(self) -> int:
        unknown = self._max_payload is None and not self._closed
        if unknown and time.monotonic() >= self._limit_unknown_until:
            try:  # one server's connect bound: a producer must not wait long in its transaction
                self._runner.run(self._connection(), 2 * self._ack_timeout)
            except Exception as exc:
                _log.debug("jetstream target %s: limit unknown: %s", self.name, exc)
                self._limit_unknown_until = time.monotonic() + _LIMIT_RETRY_S
        return self._max_payload or DEFAULT_MAX_PAYLOAD

    def _oversize(
        self, event: OutboxEvent, subject: str, limit: int, body: bytes, headers: dict[str, str]
    ) -> str | None:
        own = _OWN_HEADERS_BOUND + 4 * len(event.originator or "")
        if not event.headers and len(body) + own <= limit:
            return None  # the usual case, decided without sizing the headers
        payload, size = len(body), header_block_size(headers)
        if payload + size <= limit:
            return None
        return (
            f"jetstream target {self.name!r}: a message to {subject!r} "
            f"would be {payload + size} bytes (payload {payload} + headers {size}), over "
            f"the NATS server's max_payload of {limit} bytes"
        )

    def _error(self, subject: str, cause: str) -> str:
        return f"jetstream target {self.name!r}: publish to {subject!r} failed: {cause}"

    def _subject(self, event: OutboxEvent) -> str:
        """``event``'s subject; RenderError if its template cannot be filled from it."""
        if self._template is not None:
            return self._template.render(event)
        subject = self._subjects.get(event.event_type)
        if subject is None:
            subject = f"{self.config.subject_prefix}.{subject_token(event.event_type)}"
            self._subjects[event.event_type] = subject
        return subject

    def _no_subject(self, event: OutboxEvent, exc: RenderError) -> str:
        return (
            f"jetstream target {self.name!r}: no subject for event {event.event_id} "
            f"(seq {event.seq}): {exc}"
        )

    # -- connection ----------------------------------------------------------------------

    async def _connection(self) -> AckInbox:
        """The live connection's ack inbox, opening a new connection if there is none."""
        async with self._connect_lock:
            if self._inbox is None or not self._inbox.nc.is_connected:
                await self._disconnect()
                self._inbox = await self._open()
                self._max_payload = self._inbox.nc.max_payload
            return self._inbox

    async def _open(self) -> AckInbox:
        """Connect to the first reachable server, make sure the stream is there, subscribe."""
        lost = asyncio.Event()
        nc = await self._connect_any(lost)
        try:
            await ensure_stream(
                nc.jetstream(timeout=self._ack_timeout),
                self._stream_needs,
                self.config.create_stream,
                self.config.on_mismatch,
                f"jetstream target {self.name!r}",
            )
            inbox = AckInbox(nc, lost)
            await inbox.start()
        except TargetError:  # the stream does not fit and on_mismatch is fail
            await nc.close()
            raise
        except Exception as exc:
            await nc.close()
            raise TargetError(
                f"cannot set up stream {self.config.stream!r} and ack inbox: {describe(exc)}"
            ) from exc
        return inbox

    async def _connect_any(self, lost: asyncio.Event) -> Client:
        import nats

        """Try the servers in configured order; fail within a few ``ack_timeout``s at most."""
        causes: list[str] = []
        security = self._security()

        async def on_lost() -> None:
            lost.set()

        for server in self.config.servers:
            self._last_error = None
            try:
                return await nats.connect(
                    server,
                    name=f"tidings-{self.name}",
                    allow_reconnect=False,
                    # nats-py retries a refused first connect until the server's attempts
                    # exceed max_reconnect_attempts (0 would mean forever): 1 with no wait
                    # gives two immediate tries.
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0,
                    connect_timeout=self._ack_timeout,
                    drain_timeout=self._ack_timeout,
                    flush_timeout=self._ack_timeout,
                    error_cb=self._on_error,
                    disconnected_cb=on_lost,
                    closed_cb=on_lost,
                    **security,
                )
            except Exception as exc:
                # nats-py reports the real cause (refused, timed out) only to error_cb.
                cause = describe(self._last_error or exc)
                causes.append(hide_url_credentials(f"{server}: {cause}"))
        raise TargetError(f"cannot connect ({'; '.join(causes)})")

    async def _on_error(self, exc: Exception) -> None:
        """Keep the cause for the publish results; nats-py's own error log would only repeat it."""
        self._last_error = exc
        _log.debug("jetstream target %s: %s", self.name, describe(exc))

    def _security(self) -> dict[str, Any]:
        """nats-py's own options for the configured credentials, nkey and TLS; the TLS
        context is built once."""
        if self.config.tls is not None and self._tls is None:
            self._tls = tls_context(self.config.tls)
        return security_options(self.config, self._tls)

    async def _disconnect(self) -> None:
        """Drain a live connection, close a broken one; never raise."""
        if self._inbox is None:
            return
        nc, self._inbox = self._inbox.nc, None
        if nc.is_closed:
            return
        try:
            if nc.is_connected:
                await nc.drain()
            else:
                await nc.close()
        except Exception as exc:
            _log.debug("jetstream target %s: closing: %s", self.name, describe(exc))
