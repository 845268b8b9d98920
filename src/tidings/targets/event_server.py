"""The event-server target: the relay publishing into a remote tidings event server.

Events are sent the way the embedded event-store target stores them (same type, payload and
source timestamp), over the Eventer protocol with tidings' ``TidingsEventer.MsgRegisterReq``
extension, which carries each event's outbox id: the server deduplicates on it, so an event
published again after a relay crash or a lost reply is stored once, and the chain from the
outbox to the server's log is exactly-once. A hat-event server does not know the extension
and closes the connection, which shows up as a clear target error.

The target is synchronous (Spark tasks call it) while the client is asyncio, so each target
owns a small event loop in a daemon thread; calls wait on it with the configured timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from tidings.address import Address
from tidings.config import Duration, TargetConfig, parse_duration
from tidings.errors import TargetCallFailed, TargetUnavailable
from tidings.events.model import StoredEvent
from tidings.events.outbox import OutboxEvent
from tidings.targets.base import Target
from tidings.targets.event_store import to_new_event

if TYPE_CHECKING:  # the client (and the wire) load where a connection is made
    from tidings.client import Client

#: Bytes of payload per register request: far below the server's frame limit (16 MiB by
#: default), large enough that requests, not round trips, carry the throughput.
_REQUEST_BYTES = 4 * 1024 * 1024


class EventServerTargetConfig(TargetConfig):
    """A tidings event server over the network (the Eventer protocol, ``tcp+sbs://``).

    Events travel with their outbox event id (a tidings extension of the protocol), so the
    server stores each outbox event once however often it is published.
    """

    kind: Literal["event_server"]
    address: Address = "tcp+sbs://127.0.0.1:23012"
    type_prefix: list[str] = Field(default_factory=list)
    timeout: Duration = timedelta(seconds=10)

    _durations = field_validator("timeout", mode="before")(lambda cls, v: parse_duration(v))


def _requests(events: Sequence[OutboxEvent]) -> list[Sequence[OutboxEvent]]:
    """``events`` cut, in order, into requests of about ``_REQUEST_BYTES`` of payload."""
    chunks: list[Sequence[OutboxEvent]] = []
    start, size = 0, 0
    for n, event in enumerate(events):
        size += len(event.payload) + len(event.event_type) + 64
        if size > _REQUEST_BYTES and n > start:
            chunks.append(events[start:n])
            start, size = n, len(event.payload) + len(event.event_type) + 64
    chunks.append(events[start:])
    return chunks


class EventServerTarget(Target):
    """Publishes to the event server at ``config.address``, connecting on first use.

    One call is one session on the server, stored in one transaction, so the target is
    ``atomic``: if the server refuses any event of a call, the whole call is reported failed,
    and the relay narrows it down to the refused event (the events the server did store come
    back as duplicates on the narrower calls and are not stored twice).
    """

    atomic = True
    config_model = EventServerTargetConfig

    def __init__(self, name: str, config: EventServerTargetConfig) -> None:
        super().__init__(name)
        self._config = config
        self._type_prefix = tuple(config.type_prefix)
        self._timeout = config.timeout.total_seconds()
        self._client: Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    @property
    def config(self) -> EventServerTargetConfig:
        return self._config

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """Register ``events`` in requests of at most ~4 MiB, in order.

        A request fits the server's frame limit whatever the call's size; if one fails, the
        requests before it are confirmed (for every key, a prefix of its run in log order)
        and the call is reported failed as a whole for the rest.
        """
        done = 0
        for chunk in _requests(events):
            try:
                self._register_chunk(chunk)
            except TargetUnavailable:
                if not done:
                    raise
                self._fail(events, done, "lost the connection")
            except TargetCallFailed as exc:
                self._fail(events, done, str(exc))
            done += len(chunk)
        return [None] * len(events)

    def _register_chunk(self, events: Sequence[OutboxEvent]) -> None:
        prefix = f"event server target {self.name!r} ({self._config.address})"
        try:
            with self._lock:
                future = asyncio.run_coroutine_threadsafe(self._register(events), self._running())
                try:
                    results = future.result(self._timeout + 1)
                except BaseException:
                    # Nothing of this call may go on after it has reported (it would race the
                    # next call on the connection); a late store is harmless (outbox dedup).
                    future.cancel()
                    raise
        except TargetUnavailable:
            raise
        except Exception as exc:
            raise TargetCallFailed(f"{prefix} failed: {type(exc).__name__}: {exc}") from exc
        refused = sum(result is None for result in results)
        if refused:  # the relay splits the call until the refused event is alone
            raise TargetCallFailed(f"{prefix} refused {refused} of {len(events)} events")

    def _fail(self, events: Sequence[OutboxEvent], done: int, cause: str) -> None:
        confirmed = [n < done for n in range(len(events))]
        raise TargetCallFailed(cause, confirmed=confirmed)

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
            if loop is None:
                return
            # Closing ends the loop thread whatever the link does.
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._disconnect(), loop).result(self._timeout)
            loop.call_soon_threadsafe(loop.stop)

    async def _register(self, events: Sequence[OutboxEvent]) -> list[StoredEvent | None]:
        new_events = [to_new_event(event, self._type_prefix) for event in events]
        try:
            async with asyncio.timeout(self._timeout):  # connecting and registering together
                if self._client is None:
                    try:
                        from tidings.client import connect

                        self._client = await connect(self._config.address)
                    except OSError as exc:
                        raise TargetUnavailable(
                            f"event server target {self.name!r}: cannot connect to "
                            f"{self._config.address}: {exc}"
                        ) from exc
                return await self._client.register_outbox(new_events)
        except BaseException:
            # Whatever happened to the link, the next call starts on a fresh connection.
            await self._disconnect()
            raise

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _running(self) -> asyncio.AbstractEventLoop:
        """The target's event loop, started on first use (called with the lock held)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name=f"tidings-target-{self.name}", daemon=True
            ).start()
            self._loop = loop
        return self._loop
