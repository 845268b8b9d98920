"""The event-server target: the relay publishing into a remote tidings event server.

Events are sent the way the embedded event-store target stores them (same type, payload and
source timestamp), over the Eventer protocol with tidings' ``TidingsEventer.MsgRegisterReq``
extension, which carries each event's outbox id: the server deduplicates on it, so an event
published again after a relay crash or a lost reply is stored once, and the chain from the
outbox to the server's log is exactly-once. A hat-event server does not know the extension
and closes the connection, which shows up as a clear target error.

An event's type on the server is ``type_prefix`` plus the outbox type, or, with
``type_template``, one segment per template segment filled from the event
(:mod:`tidings.targets.destination`), e.g. ``["orders", "{headers.aggregate_type}",
"{event_type}"]``. An event whose template cannot be filled fails alone at this target.

The server is one of a group (:mod:`tidings.targets.kinds.server_group`): one address,
an ordered list of addresses, or the servers a Hat Monitor blesses. When the connection to
the server in use is lost, the call goes again, whole, to another server of the group; the
events of a call are confirmed only by the server's reply, and a server that already holds
one (the outbox id, carried across a synced pair by the Syncer) does not store it twice. If
no server accepts within ``failover_wait``, the target is down (the relay holds the events).

Servers sync each other asynchronously, so what the lost server confirmed just before it
died may be missing on the next one. On every new connection the target therefore first
sends again the events confirmed within ``failover_resend``
(:mod:`tidings.targets.kinds.resend_window`), in log order, before the call it is making:
the new server stores those it lacks ahead of the later events of their keys and
recognises the others by outbox id. What was confirmed is read from the outbox log the
relay's tasks attach (:meth:`attach_log`), which records the confirmations of every Spark
worker and every earlier relay process, and completed from this instance's memory (what
its process confirmed and has not recorded yet).

Over TLS (``ssl+sbs://`` addresses) the servers' certificates are verified, against ``tls``'s
CA or the system's, and ``tls`` holds the relay's client certificate for servers with mutual
TLS (:mod:`tidings.config.tls`).

The target is synchronous (Spark tasks call it) while the client is asyncio, so each target
owns a small event loop in a daemon thread (:mod:`tidings.targets.loop_thread`); calls wait
on it with the configured timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from tidings.errors import ConnectionClosed, TargetCallFailed, TargetUnavailable
from tidings.events.model import NewEvent, StoredEvent
from tidings.events.outbox import OutboxEvent
from tidings.events.validation import reserved_type_problem
from tidings.targets.base import Target
from tidings.targets.destination import RenderError
from tidings.targets.kinds.event_server_config import (
    EventServerTargetConfig,
    segment_template,
)
from tidings.targets.kinds.event_store import to_new_event
from tidings.targets.kinds.resend_window import ResendWindow, read_recorded, weight
from tidings.targets.kinds.server_group import ServerGroup
from tidings.targets.loop_thread import LoopThread

if TYPE_CHECKING:  # the client (and the wire) load where a connection is made
    from tidings.client import Client
    from tidings.outbox.confirmations import ConfirmationLog

log = logging.getLogger(__name__)

#: Bytes of payload per register request: far below the server's frame limit (16 MiB by
#: default), large enough that requests, not round trips, carry the throughput.
_REQUEST_BYTES = 4 * 1024 * 1024


def _requests(events: Sequence[NewEvent]) -> list[tuple[int, int]]:
    """``events`` cut, in order, into requests of about ``_REQUEST_BYTES`` of payload: the
    (start, end) index range of each."""
    chunks: list[tuple[int, int]] = []
    start, size = 0, 0
    for n, event in enumerate(events):
        size += (event_weight := weight(event))
        if size > _REQUEST_BYTES and n > start:
            chunks.append((start, n))
            start, size = n, event_weight
    chunks.append((start, len(events)))
    return chunks


class EventServerTarget(Target):
    """Publishes to a server of its group (one address, several, or the Monitor's choice),
    connecting on first use and moving to another server when its connection is lost.

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
        self._type_template = (
            tuple(segment_template(s) for s in config.type_template)
            if config.type_template is not None
            else None
        )
        self._timeout = config.timeout.total_seconds()
        self._wait = min(config.failover_wait.total_seconds(), self._timeout)
        # A call may connect twice (once after losing its server), and each time read the
        # outbox log and send the window again (a request per ~4 MiB of it) before registering.
        resend_requests = -(-config.failover_resend_bytes // _REQUEST_BYTES) + 1
        self._bound = 2 * (self._wait + self._timeout * (2 + resend_requests)) + 1
        self._log: ConfirmationLog | None = None
        self._window = ResendWindow(
            config.failover_resend.total_seconds(),
            config.failover_resend_events,
            config.failover_resend_bytes,
        )
        self._group = ServerGroup(self._who(), config.server_addresses, config.monitor, config.tls)
        self._client: Client | None = None
        self._server = ""  # the address self._client is connected to
        self._loop = LoopThread(f"tidings-target-{name}")
        self._lock = threading.Lock()

    @property
    def config(self) -> EventServerTargetConfig:
        return self._config

    def attach_log(self, log: ConfirmationLog) -> None:
        """Read what was confirmed before a move from ``log`` as well as from memory."""
        self._log = log

    def publish(self, events: Sequence[OutboxEvent]) -> list[str | None]:
        """Register ``events`` in requests of at most ~4 MiB, in order.

        A request fits the server's frame limit whatever the call's size; if one fails, the
        requests before it are confirmed (for every key, a prefix of its run in log order)
        and the call is reported failed as a whole for the rest.

        An event whose ``type_template`` cannot be filled fails alone with the reason; the
        later events of its key in this call are not sent (they must not overtake it).
        """
        results: list[str | None] = [None] * len(events)
        sendable: list[int] = []  # indexes into events, in order
        new_events: list[NewEvent] = []
        seqs: list[int] = []
        stopped: dict[str, int] = {}  # ordering key -> seq of its event without a type
        for n, event in enumerate(events):
            if (behind := stopped.get(event.ordering_key)) is not None:
                results[n] = f"{self._who()}: not sent, behind seq {behind} of its key"
                continue
            try:
                new_events.append(self._new_event(event))
            except RenderError as exc:
                results[n] = self._no_type(event, exc)
                stopped[event.ordering_key] = event.seq
                continue
            sendable.append(n)
            seqs.append(event.seq)
        for start, end in _requests(new_events) if new_events else []:
            try:
                self._register_chunk(new_events[start:end], seqs[start:end])
            except TargetUnavailable:
                if not start:
                    raise
                self._fail(len(events), sendable[:start], "lost the connection")
            except TargetCallFailed as exc:
                self._fail(len(events), sendable[:start], str(exc))
        return results

    def refusal(self, event: OutboxEvent) -> str | None:
        """The event's ``type_template`` cannot be filled from it (it never will be)."""
        try:
            self._new_event(event)
        except RenderError as exc:
            return self._no_type(event, exc)
        return None

    def _new_event(self, event: OutboxEvent) -> NewEvent:
        """The server event ``event`` becomes; RenderError if its type cannot be built."""
        if self._type_template is None:
            new_event = to_new_event(event, self._type_prefix)
        else:
            event_type = tuple(segment.render(event) for segment in self._type_template)
            new_event = replace(to_new_event(event, ()), type=event_type)
        # The servers' consumer events are theirs alone (the server would refuse it too).
        if (problem := reserved_type_problem(new_event.type)) is not None:
            raise RenderError(problem)
        return new_event

    def _who(self) -> str:
        return f"event server target {self.name!r}"

    def _no_type(self, event: OutboxEvent, exc: RenderError) -> str:
        return f"{self._who()}: no type for event {event.event_id} (seq {event.seq}): {exc}"

    def _register_chunk(self, events: Sequence[NewEvent], seqs: Sequence[int]) -> None:
        prefix = f"event server target {self.name!r} ({self._group.describe()})"
        try:
            with self._lock:
                # Nothing of this call goes on after it has reported (it would race the next
                # call on the connection); a late store is harmless (outbox dedup).
                results = self._loop.run(self._register(events), self._bound)
                if None not in results:  # confirmed: kept, in the order confirmed
                    self._window.add(zip(seqs, events, strict=True))
        except (TargetUnavailable, TargetCallFailed):
            raise
        except Exception as exc:
            raise TargetCallFailed(f"{prefix} failed: {type(exc).__name__}: {exc}") from exc
        refused = sum(result is None for result in results)
        if refused:  # the relay splits the call until the refused event is alone
            raise TargetCallFailed(f"{prefix} refused {refused} of {len(events)} events")

    def _fail(self, count: int, done: list[int], cause: str) -> None:
        """The call failed after the events at indexes ``done`` (of ``count``) were stored."""
        stored = set(done)
        raise TargetCallFailed(cause, confirmed=[n in stored for n in range(count)])

    def close(self) -> None:
        with self._lock:
            if not self._loop.started:
                return
            # Closing ends the loop thread whatever the link does.
            with contextlib.suppress(Exception):
                self._loop.run(self._leave(), self._timeout)
            self._loop.stop()
            self._window.clear()

    async def _register(self, new_events: Sequence[NewEvent]) -> list[StoredEvent | None]:
        """Register on the current server, or on another one if its connection is lost.

        A lost connection is taken as the server's loss once: the events (none of them
        confirmed) go again, to whichever server of the group accepts, which stores those it
        already holds once (outbox dedup). Lost again on a fresh connection, the request
        itself may be what the server refuses (a frame too large, an unknown message), so
        the call fails as a whole and the relay narrows it down.

        A new connection first gets the events confirmed within ``failover_resend``
        (:meth:`_resend`); they are older in their keys than any of this call's events,
        which the relay sends only once the earlier ones of their keys are confirmed. A
        connection lost again while those go is no fault of this call's events (none was
        sent): the target is unavailable for now.
        """
        lost: str | None = None
        resending = False
        while True:
            try:
                if self._client is None:
                    gone = self._server if lost is not None else None
                    self._client, self._server = await self._group.connect(self._wait, gone)
                    if lost is not None:
                        log.warning(
                            "event server target %r: publishing to %s now (%s)",
                            self.name,
                            self._server,
                            lost,
                            extra={"target": self.name, "server": self._server},
                        )
                    resending = True
                    await self._resend(self._client)
                    resending = False
                async with asyncio.timeout(self._timeout):
                    return await self._client.register_outbox(new_events)
            except (ConnectionClosed, OSError) as exc:
                await self._disconnect()
                if lost is not None and resending:
                    raise TargetUnavailable(
                        f"event server target {self.name!r}: the connection was lost again "
                        f"({self._server}) while sending the events confirmed before: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                if lost is not None:
                    raise TargetCallFailed(
                        f"event server target {self.name!r}: the connection was lost again "
                        f"({self._server}): {type(exc).__name__}: {exc}"
                    ) from exc
                lost = f"lost {self._server}: {type(exc).__name__}: {exc}"
            except BaseException:
                # Whatever happened to the link, the next call starts on a fresh connection.
                await self._disconnect()
                raise

    async def _resend(self, client: Client) -> None:
        """Send what was confirmed within the window again to the server just connected, in
        log order, before anything else: what the outbox log records (every process's
        confirmations) and what this instance remembers (its own, recorded or not yet).

        The events stay confirmed whatever happens here. A lost connection counts as the
        new server's loss (see :meth:`_register`); a refusal, a timeout or an outbox log
        that cannot be read makes the target unavailable for now (nothing of the call was
        sent), and the next call sends the window again, by then shorter by age.
        """
        recorded = await read_recorded(
            self._log, self.name, self._window, self._new_event, self._timeout
        )
        events = self._window.with_recorded(recorded)
        if not events:
            return
        new_events = [event for _, event in events]
        for start, end in _requests(new_events):
            try:
                async with asyncio.timeout(self._timeout):
                    results = await client.register_outbox(new_events[start:end])
            except TimeoutError as exc:
                raise TargetUnavailable(
                    f"event server target {self.name!r}: {self._server} did not take the "
                    f"{len(events)} events confirmed before within {self._timeout:g}s"
                ) from exc
            if refused := sum(result is None for result in results):
                raise TargetUnavailable(
                    f"event server target {self.name!r}: {self._server} refused {refused} of "
                    f"the {len(events)} events confirmed before, sent again after a move"
                )
        self._window.renew(events)
        log.info(
            "event server target %r: sent %d recently confirmed events again to %s "
            "(%d of them read from the outbox log)",
            self.name,
            len(events),
            self._server,
            len(recorded),
            extra={"target": self.name, "server": self._server, "events": len(events)},
        )

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _leave(self) -> None:
        await self._disconnect()
        await self._group.aclose()
