"""The ``rabbitmq_stream`` target: publishing outbox events to RabbitMQ streams, exactly once.

The relay calls :meth:`RabbitMQStreamTarget.publish` synchronously from Spark tasks, while
rstream is asyncio-only; as the other asyncio targets do, this one owns a private event loop
in a daemon thread (:mod:`tidings.targets.loop_thread`) and one connection, which every
calling thread shares, with one sender per stream (:mod:`.sender`), each sending one batch
at a time.

A call goes in phases: each phase takes, for every ordering key, its next events that go to
one stream (all of them, usually: a key's events rarely change stream), sends each stream's
share as one batch (ids ascending in call order, so the broker stores a key's events in log
order) and waits for the confirms; a key whose event failed sends nothing more. Whom a
failure is charged to:

* an event that cannot be sent (no stream name, too large), or that the broker refused:
  that event's error, the rest of its key not sent;
* no broker can be reached, a stream does not exist (without ``create_stream``) or is
  refused to the user, no producer reference is free, or the broker answered none of a
  batch within ``confirm_timeout``: :class:`~tidings.errors.TargetUnavailable`, nothing
  charged;
* the connection dropped during the call, or answers stopped after some came:
  :class:`~tidings.errors.TargetCallFailed` with what was confirmed, so the relay narrows
  the call down; the sender's reference is abandoned (:mod:`.sender`, rule 5).

The outbox log must be attached (:meth:`attach_log`): the producer references and the
publishing ids live there. The relay's and the replay's tasks attach it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import ssl
import uuid
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidings.errors import TargetCallFailed, TargetError, TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.outbox.stream_ids import StreamIds
from tidings.targets.base import Target
from tidings.targets.destination import RenderError
from tidings.targets.kinds.rabbitmq_stream.config import RabbitMQStreamTargetConfig
from tidings.targets.kinds.rabbitmq_stream.connection import (
    RESPONSE_CODES,
    ConnectionLost,
    StreamConnection,
    describe,
)
from tidings.targets.kinds.rabbitmq_stream.messages import (
    message,
    oversize,
    stream_problem,
    stream_template,
)
from tidings.targets.kinds.rabbitmq_stream.sender import Item, Sent, StreamSender
from tidings.targets.loop_thread import LoopThread
from tidings.targets.rounds import not_sent

if TYPE_CHECKING:
    from tidings.outbox.confirmations import ConfirmationLog

#: Publish-error codes that say the stream, not the message, is the problem.
_STREAM_CODES = frozenset({2, 6, 16, 18})


class RabbitMQStreamTarget(Target):
    """Publishes events to RabbitMQ streams with producer de-duplication; connects lazily,
    reconnects after failures."""

    atomic = False
    #: A key's events in one stream go in one batch, in order; a run is bounded so that one
    #: call still returns within seconds.
    events_per_key = 500
    config_model = RabbitMQStreamTargetConfig

    def __init__(self, name: str, config: RabbitMQStreamTargetConfig) -> None:
        super().__init__(name)
        self.config = config
        self._timeout = config.confirm_timeout.total_seconds()
        self._lease = config.producer_lease.total_seconds()
        self._template = stream_template(config.stream)
        self._holder = f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._tls: ssl.SSLContext | None = None
        self._ids: StreamIds | None = None
        self._connection: StreamConnection | None = None
        self._senders: dict[str, StreamSender] = {}
        self._connect_lock = asyncio.Lock()
        self._frame_max = config.frame_max
        self._closed = False
        self._runner = LoopThread(f"tidings-rabbitmq-stream-{name}")

    # -- the Target interface ------------------------------------------------------------

    def attach_log(self, log: ConfirmationLog) -> None:
        """Keep the producer references and publishing ids in the relay's outbox log."""
        if self._ids is None or self._ids.engine is not log.engine:
            self._ids = StreamIds(log.engine, self.name)

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """Publish ``events``, exactly once; None per confirmed event, else why it was not."""
        if self._closed:
            raise TargetError(f"rabbitmq_stream target {self.name!r} is closed")
        if not events:
            return []
        if self._ids is None:
            raise TargetUnavailable(
                f"rabbitmq_stream target {self.name!r}: no outbox log attached (the producer "
                "references and publishing ids are kept there)"
            )
        timeout = (self._lease + 4 * self._timeout) * 3 + 10
        try:
            return self._runner.run(self._publish(events), timeout)
        except concurrent.futures.TimeoutError:
            raise TargetCallFailed(
                f"rabbitmq_stream target {self.name!r}: no result within {timeout:g}s"
            ) from None

    def refusal(self, event: OutboxEvent) -> str | None:
        """The event has no stream (its template cannot be filled, or the name is not one
        RabbitMQ takes), or its message is larger than a frame. Needs no connection."""
        prepared = self._prepare(event)
        return prepared if isinstance(prepared, str) else None

    def close(self) -> None:
        """Give the producer references back, close the connection, stop the loop thread;
        idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._runner.started:
            with contextlib.suppress(concurrent.futures.TimeoutError):
                self._runner.run(self._shutdown(), self._timeout + 5)
        self._runner.stop()

    # -- one call ------------------------------------------------------------------------

    async def _publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        results: list[str | None] = [None] * len(events)
        confirmed = [False] * len(events)
        prepared = [self._prepare(event) for event in events]
        runs: dict[str, deque[int]] = {}
        for index, event in enumerate(events):
            runs.setdefault(event.ordering_key, deque()).append(index)
        pending = [run for run in runs.values() if run]
        while pending:
            phase: dict[str, list[Item]] = {}
            taken: list[tuple[deque[int], list[int]]] = []
            for run in pending:
                stream: str | None = None
                mine: list[int] = []
                while run:
                    index = run[0]
                    ready = prepared[index]
                    if isinstance(ready, str):
                        if not mine:  # refused: fails alone, its key stops here
                            run.popleft()
                            results[index] = ready
                            _stop(run, results, events[index])
                        break
                    if stream is not None and ready[0] != stream:
                        break
                    stream = ready[0]
                    mine.append(run.popleft())
                    phase.setdefault(stream, []).append(
                        Item(index, events[index].event_id, ready[1])
                    )
                taken.append((run, mine))
            if phase:
                for items in phase.values():  # ids in log order, not key by key
                    items.sort(key=lambda item: item.index)
                await self._send_phase(phase, events, results, confirmed)
            for run, mine in taken:
                if any(results[index] is not None for index in mine):
                    culprit = next(i for i in mine if results[i] is not None)
                    _stop(run, results, events[culprit])
            pending = [run for run, _ in taken if run]
        return results

    async def _send_phase(
        self,
        phase: dict[str, list[Item]],
        events: Sequence[OutboxEvent],
        results: list[str | None],
        confirmed: list[bool],
    ) -> None:
        """Send each stream's items as one batch, the streams at once; record the answers."""
        try:
            connection = await self._connection_ready()
        except TargetError as exc:
            raise TargetUnavailable(f"rabbitmq_stream target {self.name!r}: {exc}") from None
        streams = sorted(phase)
        outcomes = await asyncio.gather(
            *(self._send_stream(connection, stream, phase[stream]) for stream in streams),
            return_exceptions=True,
        )
        failures: list[BaseException] = []
        unanswered = 0
        for stream, outcome in zip(streams, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failure = self._failure(stream, outcome)
                failures.append(failure)
                for item in phase[stream]:
                    results[item.index] = str(failure)
                continue
            for item in phase[stream]:
                answer = outcome.answers.get(item.index)
                if answer is True:
                    confirmed[item.index] = True
                elif answer is None:
                    unanswered += 1
                    results[item.index] = self._error(stream, self._no_confirm(outcome))
                else:
                    results[item.index] = self._error(stream, _refused(answer))
                    if answer in _STREAM_CODES:
                        failures.append(TargetUnavailable(self._error(stream, _refused(answer))))
        if not failures and not unanswered:
            return
        await self._blame(failures, unanswered, confirmed, len(events))

    async def _blame(
        self, failures: list[BaseException], unanswered: int, confirmed: list[bool], size: int
    ) -> None:
        """Raise if the broker or the connection, not one message, is why the phase failed;
        else return (each event's own error stands)."""
        for failure in failures:
            if not isinstance(failure, TargetError):
                raise failure  # a bug, not the broker: the relay narrows and logs it
        lost = any(isinstance(f, ConnectionLost) for f in failures)
        if lost or unanswered:
            await self._drop_connection()
        if not any(confirmed):
            down = [f for f in failures if isinstance(f, TargetUnavailable)]
            if down:
                raise TargetUnavailable(str(down[0]))
            if unanswered or lost:
                raise TargetUnavailable(
                    f"rabbitmq_stream target {self.name!r}: the broker answered none of the "
                    f"messages within {self._timeout:g}s, or the connection dropped"
                )
        if size == 1:
            return
        if lost or unanswered or failures:
            raise TargetCallFailed(
                f"rabbitmq_stream target {self.name!r}: the connection dropped or the broker "
                f"stopped answering during the call ({confirmed.count(True)} of {size} "
                "confirmed)",
                confirmed=confirmed,
            )

    async def _send_stream(
        self, connection: StreamConnection, stream: str, items: list[Item]
    ) -> Sent:
        """One stream's batch through its sender; a sender that cannot know what became of
        what it sent abandons its reference."""
        sender = self._sender(stream)
        async with sender.lock:
            try:
                await self._stream_ready(connection, stream)
                return await sender.send(connection, items, self._senders)
            finally:
                if sender.in_flight:  # whatever failed, what was sent may yet be stored
                    await asyncio.to_thread(sender.abandon)

    def _failure(self, stream: str, exc: BaseException) -> BaseException:
        """What a stream's batch raised, as the call's failure: the connection lost, or the
        stream unavailable (missing, refused, no reference free, no answer in time); any
        other exception is a bug and stays as it is."""
        if isinstance(exc, TimeoutError):
            return TargetUnavailable(self._error(stream, f"no answer in {self._timeout:g}s"))
        if isinstance(exc, ConnectionLost):
            return ConnectionLost(self._error(stream, str(exc)))
        if isinstance(exc, TargetError):
            return TargetUnavailable(self._error(stream, str(exc)))
        return exc

    def _sender(self, stream: str) -> StreamSender:
        sender = self._senders.get(stream)
        if sender is None:
            assert self._ids is not None
            sender = self._senders[stream] = StreamSender(
                self.name,
                stream,
                self._ids,
                self._holder,
                self.config.producers,
                self._lease,
                self._timeout,
            )
        return sender

    async def _stream_ready(self, connection: StreamConnection, stream: str) -> None:
        from rstream.exceptions import ServerError

        try:
            await connection.ensure_stream(stream)
        except ServerError as exc:
            raise TargetError(f"the broker refused the stream: {describe(exc)}") from None

    def _prepare(self, event: OutboxEvent) -> tuple[str, bytes] | str:
        """``event``'s stream and message data, or why it cannot be sent."""
        try:
            stream = self._template.render(event)
        except RenderError as exc:
            return self._no_stream(event, str(exc))
        if (problem := stream_problem(stream)) is not None:
            return self._no_stream(event, problem)
        try:
            data = message(event)
        except Exception as exc:  # the AMQP 1.0 encoder refuses a property
            return self._error(stream, f"cannot encode its message: {describe(exc)}")
        if (too_big := oversize(data, self._frame_max)) is not None:
            return self._error(stream, too_big)
        return stream, data

    def _error(self, stream: str, cause: str) -> str:
        return f"rabbitmq_stream target {self.name!r}: publish to stream {stream!r} failed: {cause}"

    def _no_stream(self, event: OutboxEvent, cause: str) -> str:
        return (
            f"rabbitmq_stream target {self.name!r}: no stream for event {event.event_id} "
            f"(seq {event.seq}): {cause}"
        )

    def _no_confirm(self, sent: Sent) -> str:
        return f"no confirm within {self._timeout:g}s (producer {sent.reference!r})"

    # -- connection ----------------------------------------------------------------------

    async def _connection_ready(self) -> StreamConnection:
        """The live connection, opening one if there is none (every sender then takes its
        reference again: it abandoned it when the last connection dropped)."""
        async with self._connect_lock:
            if self._connection is None or not self._connection.alive:
                await self._drop_connection()
                connection = StreamConnection(self.config, self.name, self._tls_context())
                await connection.open()
                self._connection = connection
                self._frame_max = min(self._frame_max, connection.frame_max)
            return self._connection

    async def _drop_connection(self) -> None:
        """Close the connection; every sender's reference is abandoned (what it sent may be
        in flight)."""
        connection, self._connection = self._connection, None
        for sender in self._senders.values():
            if sender.slot is not None:
                await asyncio.to_thread(sender.abandon)
            sender.publisher_id = None
        if connection is not None:
            await connection.close()

    async def _shutdown(self) -> None:
        """At close: nothing is in flight, so every reference is released cleanly."""
        for sender in self._senders.values():
            try:
                await asyncio.to_thread(sender.release)
            except Exception:  # the log is gone: the leases expire
                sender.slot = None
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    def _tls_context(self) -> ssl.SSLContext | None:
        if not any(s.startswith("rabbitmq-stream+tls:") for s in self.config.servers):
            return None
        if self._tls is None:
            if self.config.tls is None:
                self._tls = ssl.create_default_context()
            else:
                try:
                    self._tls = self.config.tls.context()
                except Exception as exc:
                    raise TargetError(f"cannot load the TLS files: {exc}") from None
        return self._tls


def _stop(run: deque[int], results: list[str | None], culprit: OutboxEvent) -> None:
    """The rest of a key's run is not sent: an earlier event of the key failed."""
    while run:
        results[run.popleft()] = not_sent(culprit)


def _refused(code: int) -> str:
    return f"refused by the broker (code {code}: {RESPONSE_CODES.get(code, 'publish error')})"
