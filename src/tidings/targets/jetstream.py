"""NATS JetStream as a target, through nats-py.

The relay calls :meth:`JetStreamTarget.publish` synchronously from Spark executor tasks
running in plain threads, while nats-py is asyncio-only. The target therefore owns one
private event loop in a daemon thread and hands it coroutines; every calling thread shares
that loop and its single connection, which is what lets one call pipeline thousands of
publishes over one socket.

Delivery is at-least-once made effectively-once by JetStream: each message carries the
event id as ``Nats-Msg-Id``, so a batch replayed after a crash is acknowledged as a
duplicate inside the stream's ``duplicate_window`` instead of being stored twice.

Subjects are ``<subject_prefix>.<token>``, where the token is the event type with every
character a NATS subject token may not hold (whitespace, ``.``, ``*``, ``>``) replaced by
``_`` (and ``_`` for an empty type). The mapping is deterministic but not injective
(``order.created`` and ``order_created`` share a subject), so consumers that need the exact
type read the ``Tidings-Event-Type`` header.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import NotFoundError

from tidings.config import JetStreamTargetConfig
from tidings.errors import TargetError
from tidings.model import OutboxEvent
from tidings.targets.base import Target

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

_UNSAFE_TOKEN_CHARS = re.compile(r"[\s.*>]")

#: Headers the target sets itself. A custom header of the same name (in any letter case)
#: is dropped, so these always mean what the target says they mean.
_TIDINGS_HEADERS = (
    "Tidings-Event-Type",
    "Tidings-Event-Version",
    "Tidings-Seq",
    "Tidings-Logged-At",
    "Tidings-Correlation-Id",
    "Tidings-Originator",
    "Tidings-Partition-Key",
)
_RESERVED_NAMES = frozenset(h.lower() for h in _TIDINGS_HEADERS)
#: ``Nats-*`` headers steer the server (dedup id, expected stream/sequence, rollup, TTL);
#: letting a producer set them could defeat deduplication or purge the stream.
_RESERVED_PREFIX = "nats-"

#: nats-py's cap on publishes awaiting an ack, set so high that it never throttles: the
#: relay's call size is the flow control, and waiting on nats-py's cap with a deadline
#: (``wait_stall``) would yield to the loop per message and so flush the socket per message.
_MAX_IN_FLIGHT = 1 << 30


def subject_token(event_type: str) -> str:
    """Map an event type to one valid NATS subject token (see the module docstring)."""
    return _UNSAFE_TOKEN_CHARS.sub("_", event_type) or "_"


def _is_reserved(header: str) -> bool:
    name = header.strip().lower()
    return name.startswith(_RESERVED_PREFIX) or name in _RESERVED_NAMES


def message_headers(event: OutboxEvent) -> dict[str, str]:
    """The NATS headers of ``event``: custom ones first, then the reserved ones that win."""
    headers = {k: v for k, v in event.headers.items() if not _is_reserved(k)}
    headers["Nats-Msg-Id"] = event.event_id
    headers["Tidings-Event-Type"] = event.event_type
    headers["Tidings-Event-Version"] = event.version
    headers["Tidings-Seq"] = str(event.seq)
    headers["Tidings-Logged-At"] = event.logged_at.isoformat()
    if event.correlation_id is not None:
        headers["Tidings-Correlation-Id"] = event.correlation_id
    if event.originator is not None:
        headers["Tidings-Originator"] = event.originator
    if event.partition_key is not None:
        headers["Tidings-Partition-Key"] = event.partition_key
    return headers


def _nanos(seconds: float) -> int:
    """JetStream keeps durations in nanoseconds; compare there, not as binary floats."""
    return round(seconds * 1e9)


def _describe(exc: BaseException) -> str:
    """Name the exception type too: several nats-py errors have empty or generic texts."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _LoopThread:
    """A private asyncio loop in a daemon thread, so synchronous callers can run coroutines."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float) -> _T:
        """Run ``coro`` on the loop; cancel it and raise TimeoutError after ``timeout``."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class JetStreamTarget(Target):
    """Publishes events to one JetStream stream; connects lazily, reconnects after failures.

    nats-py's own reconnection is disabled on purpose: while it reconnects it buffers
    publishes and replays them later, after this target has already reported them failed.
    Instead a lost connection is simply dropped, and the next :meth:`publish` opens a new one
    (and ensures the stream again, which also heals a server that lost its storage).
    """

    atomic = False

    def __init__(self, name: str, config: JetStreamTargetConfig) -> None:
        super().__init__(name)
        self.config = config
        self._ack_timeout = config.ack_timeout.total_seconds()
        self._subjects: dict[str, str] = {}
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._connect_lock = asyncio.Lock()
        self._closed = False
        self._runner = _LoopThread(f"tidings-jetstream-{name}")
        # Safety net only: every await inside a call is bounded on its own by these budgets.
        self._call_timeout = (len(config.servers) + 5) * self._ack_timeout

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """Publish all ``events`` concurrently; None per acked (or duplicate) event, else why."""
        if self._closed:
            raise TargetError(f"jetstream target {self.name!r} is closed")
        if not events:
            return []
        try:
            return self._runner.run(self._publish(events), self._call_timeout)
        except concurrent.futures.TimeoutError:
            return self._fail_all(events, f"no result within {self._call_timeout:g}s")

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

    async def _publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        try:
            js = await self._connection()
        except TargetError as exc:
            return self._fail_all(events, str(exc))
        subjects = [self._subject(e.event_type) for e in events]
        acks: list[asyncio.Future[PubAck]] = []
        try:
            for event, subject in zip(events, subjects, strict=True):
                acks.append(await self._send(js, event, subject))
            await asyncio.wait(acks, timeout=self._ack_timeout)
        finally:
            # One deadline for the whole pipelined call, not a timer per message. Acks still
            # missing then (all of them if the call was abandoned) must not stay registered
            # with nats-py forever.
            for ack in acks:
                ack.cancel()
        return [self._outcome(ack, subject) for ack, subject in zip(acks, subjects, strict=True)]

    async def _send(
        self, js: JetStreamContext, event: OutboxEvent, subject: str
    ) -> asyncio.Future[PubAck]:
        """Send one message without waiting for its ack; a send error becomes a failed future."""
        try:
            return await js.publish_async(
                subject,
                event.payload.encode(),
                headers=message_headers(event),
            )
        except Exception as exc:
            failed: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    def _outcome(self, ack: asyncio.Future[PubAck], subject: str) -> str | None:
        """None for an ack from our stream, a duplicate included: the event is stored there.

        An ack from another stream means that stream captures our subjects (a configuration
        error when ``create_stream`` is off); it is reported rather than counted as delivered.
        """
        if ack.cancelled():
            cause = f"no ack within {self._ack_timeout:g}s"
        elif (exc := ack.exception()) is not None:
            cause = _describe(exc)
        elif (stream := ack.result().stream) != self.config.stream:
            cause = f"stored in stream {stream!r}, not in {self.config.stream!r}"
        else:
            return None
        return self._error(subject, cause)

    def _fail_all(self, events: Sequence[OutboxEvent], cause: str) -> list[str | None]:
        return [self._error(self._subject(e.event_type), cause) for e in events]

    def _error(self, subject: str, cause: str) -> str:
        return f"jetstream target {self.name!r}: publish to {subject!r} failed: {cause}"

    def _subject(self, event_type: str) -> str:
        subject = self._subjects.get(event_type)
        if subject is None:
            subject = f"{self.config.subject_prefix}.{subject_token(event_type)}"
            self._subjects[event_type] = subject
        return subject

    # -- connection ----------------------------------------------------------------------

    async def _connection(self) -> JetStreamContext:
        """The live JetStream context, opening a new connection if there is none."""
        if self._js is not None and self._nc is not None and self._nc.is_connected:
            return self._js
        async with self._connect_lock:
            if self._js is None or self._nc is None or not self._nc.is_connected:
                await self._disconnect()
                self._nc, self._js = await self._open()
        return self._js

    async def _open(self) -> tuple[Client, JetStreamContext]:
        """Connect to the first reachable server and make sure the stream is there."""
        nc = await self._connect_any()
        js = nc.jetstream(timeout=self._ack_timeout, publish_async_max_pending=_MAX_IN_FLIGHT)
        if self.config.create_stream:
            try:
                await self._ensure_stream(js)
            except Exception as exc:
                await nc.close()
                raise TargetError(
                    f"cannot set up stream {self.config.stream!r}: {_describe(exc)}"
                ) from exc
        return nc, js

    async def _connect_any(self) -> Client:
        """Try each server once, in configured order, each bounded by ``ack_timeout``."""
        causes: list[str] = []
        for server in self.config.servers:
            try:
                return await nats.connect(
                    server,
                    name=f"tidings-{self.name}",
                    allow_reconnect=False,
                    connect_timeout=self._ack_timeout,
                    drain_timeout=self._ack_timeout,
                    flush_timeout=self._ack_timeout,
                    error_cb=self._on_error,
                )
            except Exception as exc:
                causes.append(f"{server}: {_describe(exc)}")
        raise TargetError(f"cannot connect ({'; '.join(causes)})")

    async def _on_error(self, exc: Exception) -> None:
        """Publish results report failures; nats-py's own error log would only repeat them."""
        _log.debug("jetstream target %s: %s", self.name, _describe(exc))

    async def _ensure_stream(self, js: JetStreamContext) -> None:
        """Create the stream, or update it if it lacks our subjects or our dedup window.

        Subjects other producers put on the stream are kept: the target only adds its own.
        """
        subject = f"{self.config.subject_prefix}.>"
        window = self.config.duplicate_window.total_seconds()
        try:
            info = await js.stream_info(self.config.stream)
        except NotFoundError:
            await js.add_stream(
                name=self.config.stream, subjects=[subject], duplicate_window=window
            )
            return
        subjects = info.config.subjects or []
        if subject in subjects and _nanos(info.config.duplicate_window) == _nanos(window):
            return
        if subject not in subjects:
            subjects = [*subjects, subject]
        await js.update_stream(info.config.evolve(subjects=subjects, duplicate_window=window))

    async def _disconnect(self) -> None:
        """Drain a live connection, close a broken one; never raise."""
        nc, self._nc, self._js = self._nc, None, None
        if nc is None or nc.is_closed:
            return
        try:
            if nc.is_connected:
                await nc.drain()
            else:
                await nc.close()
        except Exception as exc:
            _log.debug("jetstream target %s: closing: %s", self.name, _describe(exc))
