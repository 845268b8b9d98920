"""Pushing a stream to a consumer over its WebSocket (``readyToReceive``).

FTN18: events go out in groups, ``onEvents(seq, events)``, several groups in flight, seq
from 0. Each group has the position it covers (the last event's, or further when the events
in between were not wanted, or not for the consumer's user to read).

- **Reliable** (a registered component): seq has no gaps, and a reply (any reply that is not
  an error: FutoIn's stock receivers answer ``true`` or ``{}``) acknowledges its group. Groups
  are acknowledged in seq order, so the consumer's stored position moves to the covered
  position of the newest group whose earlier groups are all answered. A group counts as in
  flight until its acknowledgement is recorded (the position written and the group told,
  :mod:`..consumers.replication`), not only until its reply: at most ``max_in_flight``
  groups are ever sent and not yet recorded, which bounds what a consumer moving to another
  server of the group can get twice. An error reply, no
  reply within ``ack_timeout`` or a closed socket ends the session and closes the socket:
  the consumer reconnects, and the groups it never acknowledged are sent again from its
  stored position (nothing lost; nothing it acknowledged sent twice). A new session of the
  same consumer replaces an older one, whose later replies no longer count.
- **Live** (component ``LIVE``): starts at the newest event, keeps no state, and when the
  consumer falls more than ``live_queue_events`` behind, skips to the newest events and adds
  1 to seq, the gap that tells the consumer a group was skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tidings.config.streams import PushConfig
from tidings.errors import ConnectionClosed, StoreError, StreamError
from tidings.streams.protocol.channel import Channel
from tidings.streams.protocol.encoding import event_list
from tidings.streams.protocol.ftn3 import Reply
from tidings.streams.service.reader import StreamReader
from tidings.streams.service.selection import Selection

log = logging.getLogger(__name__)

#: Acknowledges a reliable consumer's position (persisted before it returns).
Acknowledge = Callable[[int], Awaitable[None]]
#: Bytes of an onEvents call besides its events.
_CALL_OVERHEAD = 128
#: How often a consumer's position moves past events it does not want, at most.
_SKIP_ACK_SECONDS = 1.0


class _Acknowledger:
    """Records a reliable consumer's position in the background, the newest wins: the
    session goes on pushing while the database writes, and replies that arrive together
    cost one write. An acknowledgement that fails ends the session (:meth:`check`)."""

    def __init__(self, acknowledge: Acknowledge, on_written: Callable[[], None]) -> None:
        self._acknowledge = acknowledge
        self._on_written = on_written
        self._target = 0
        self.written = 0
        self._task: asyncio.Task[None] | None = None

    def advance(self, position: int) -> None:
        if position <= self._target:
            return
        self._target = position
        if self._task is None or self._task.done():
            self.check()
            self._task = asyncio.get_running_loop().create_task(self._write())

    def check(self) -> None:
        """Raise the error of a write that failed."""
        if self._task is not None and self._task.done() and not self._task.cancelled():
            error = self._task.exception()
            if error is not None:
                raise error

    async def flush(self) -> None:
        """Wait until everything advanced to is written."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        self.check()

    async def _write(self) -> None:
        while self._target > self.written:
            target = self._target
            await self._acknowledge(target)
            self.written = target
            self._on_written()


@dataclass
class _Group:
    seq: int
    covers: int
    reply: asyncio.Future[Reply]


class PushSession:
    """One push to one consumer on one channel; :meth:`run` until the channel closes."""

    def __init__(
        self,
        reader: StreamReader,
        channel: Channel,
        config: PushConfig,
        *,
        function: str,
        message_bytes: int,
        selection: Selection,
        start: int,
        acknowledge: Acknowledge | None,
        ack_timeout: float,
    ) -> None:
        self._reader = reader
        self._channel = channel
        self._config = config
        self._function = function
        self._max_bytes = message_bytes - _CALL_OVERHEAD
        self._selection = selection
        self._sent = start
        self._wake = asyncio.Event()
        self._acks = None if acknowledge is None else _Acknowledger(acknowledge, self._wake.set)
        self._ack_timeout = ack_timeout
        self._seq = 0
        self._skip_ack_at = 0.0
        self._in_flight: deque[_Group] = deque()
        #: The covered positions of groups answered but not yet recorded, in seq order.
        self._unrecorded: deque[int] = deque()
        self.stopped = asyncio.Event()

    @property
    def reliable(self) -> bool:
        return self._acks is not None

    async def run(self) -> None:
        """Push until the channel closes, the consumer fails a group, or :meth:`stop`."""
        try:
            await self._loop()
            if self._acks is not None:
                await self._acks.flush()
        except (ConnectionClosed, asyncio.CancelledError):
            pass
        except (StoreError, StreamError, TimeoutError) as exc:
            log.warning("stream push ended", extra={"peer": self._channel.peer, "error": str(exc)})
        finally:
            self.stopped.set()
            if self.reliable:
                self._channel.close()  # reconnect: resend what was not acknowledged

    def stop(self) -> None:
        self.stopped.set()
        self._wake.set()

    async def _loop(self) -> None:
        """Send while groups may be in flight, else sleep until something happens: new
        events in the feed, a reply, the channel closing, :meth:`stop` (one event, set by
        each of them, so a turn creates no tasks)."""
        wake = self._wake
        feed = self._reader.feed
        feed.waiters.add(wake.set)
        self._channel.on_close = wake.set
        try:
            while True:
                wake.clear()
                self._settle()  # replies that came before a close still count
                if self._channel.closed.is_set() or self.stopped.is_set():
                    return
                room = len(self._in_flight) + len(self._unrecorded) < self._config.max_in_flight
                if room and await self._send_group():
                    continue
                if room and feed.high > self._sent:
                    continue  # the feed moved while the group was read
                await self._sleep(wake)
        finally:
            feed.waiters.discard(wake.set)

    async def _sleep(self, wake: asyncio.Event) -> None:
        """Wait for a wake-up; TimeoutError if the oldest group stays unanswered."""
        if not self._in_flight:
            await wake.wait()
            return
        try:
            async with asyncio.timeout(self._ack_timeout):
                await wake.wait()
        except TimeoutError:
            if self._in_flight and not self._in_flight[0].reply.done():
                raise TimeoutError(
                    f"consumer did not answer onEvents seq {self._in_flight[0].seq} within "
                    f"{self._ack_timeout:g} s"
                ) from None

    async def _send_group(self) -> bool:
        """Send the next group if there is one; True if a group went out."""
        config = self._config
        feed = self._reader.feed
        if not self.reliable and feed.pending(self._sent) > config.live_queue_events:
            self._sent = feed.newest(config.live_queue_events)
            self._seq += 1  # the gap that marks the skipped events
        if 0 < feed.pending(self._sent) < config.max_group_events and not self._in_flight:
            await asyncio.sleep(config.group_delay.total_seconds())  # let a group fill up
        batch = await self._reader.read(
            self._sent, self._selection, config.max_group_events, self._max_bytes
        )
        if self.stopped.is_set():
            return False
        if not batch.events:
            self._sent = max(self._sent, batch.scanned)
            now = time.monotonic()
            if self._acks is not None and not self._in_flight and now >= self._skip_ack_at:
                # Nothing selected up to there: move the stored position past it (at most
                # once a second; a restart before that only reads those events again).
                self._skip_ack_at = now + _SKIP_ACK_SECONDS
                self._acks.advance(self._sent)
            return False
        params = b'{"seq":%d,"events":' % self._seq + event_list(batch.events) + b"}"
        reply = await self._channel.call(self._function, params)
        reply.add_done_callback(lambda _: self._wake.set())
        self._in_flight.append(_Group(self._seq, batch.scanned, reply))
        self._seq += 1
        self._sent = batch.scanned
        return True

    def _settle(self) -> None:
        """Take the answered groups at the head of the queue, in seq order."""
        if self._acks is not None:
            self._acks.check()
        while self._in_flight and self._in_flight[0].reply.done():
            if self._in_flight[0].reply.exception() is not None:
                break  # the channel closed before this reply: it never came
            group = self._in_flight.popleft()
            reply = group.reply.result()
            if reply.error is not None:
                if self.reliable:
                    raise ConnectionClosed(
                        f"consumer refused onEvents seq {group.seq}: {reply.error} "
                        f"{reply.description}"
                    )
                log.info("live consumer refused a group", extra={"error": reply.error})
            if self._acks is not None:
                self._acks.advance(group.covers)
                self._unrecorded.append(group.covers)
        if self._acks is not None:
            while self._unrecorded and self._unrecorded[0] <= self._acks.written:
                self._unrecorded.popleft()


async def stop_session(
    session: PushSession, task: asyncio.Task[None], *, grace: float = 5.0
) -> None:
    """Stop a session and wait for it to end: first up to ``grace`` seconds for it to take
    the replies that arrived and record their acknowledgements, then it is cancelled."""
    session.stop()
    with contextlib.suppress(asyncio.CancelledError, TimeoutError, Exception):
        async with asyncio.timeout(grace):
            await asyncio.shield(task)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
