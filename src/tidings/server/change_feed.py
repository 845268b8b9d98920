"""The change feed: every newly stored event reaches the listeners once, in position order.

Batches come from this server's own writes (the engine's sessions, stored by the write
thread or on the loop, and the synced events of its Syncer clients), but other processes may
append to the same database (a relay's event-store target, a second store). Positions are
dense, so a batch that does not start right after the last delivered position shows such a
gap: the missing events are read from the store first, grouped by session, and batches
arriving meanwhile wait their turn. An idle server looks for outside writes every
:attr:`ChangeFeed.POLL_SECONDS`. Subscribers and Syncer peers therefore see every stored
event, one session at a time, on the event loop; who hears of a batch when is the
durability's business (:mod:`tidings.server.writing.durability`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor

from tidings.events.model import StoredEvent
from tidings.server.engine import Engine

log = logging.getLogger(__name__)


class ChangeFeed:
    """Delivers the store's new events to ``emit`` once each, in position order; create it
    on the loop that will use it. Gaps are read from the store in the ``readers`` pool."""

    POLL_SECONDS = 0.5

    def __init__(
        self, engine: Engine, readers: Executor, emit: Callable[[list[StoredEvent]], None]
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._store = engine.store
        self._readers = readers
        self._emit = emit
        #: Batches stored by the write thread, waiting for the loop to deliver them (the
        #: sessions of one group cross to the loop in one wake-up, see _from_engine_thread).
        self._crossing: list[list[StoredEvent]] = []
        self._crossing_lock = threading.Lock()
        self._remove_callback = engine.on_registered(self._from_engine_thread)
        self._delivered = self._store.last_position()
        self._waiting: list[list[StoredEvent]] = []
        self._catching_up: asyncio.Task[None] | None = None
        #: The last catch-up failed (the database is unreachable): batches wait for the
        #: next poll to retry, rather than retrying at once on every write.
        self._stalled = False
        self._closed = False
        self._poller = self._loop.create_task(self._poll(), name="tidings-poll")

    def deliver_synced(self, events: list[StoredEvent]) -> None:
        """Newly stored synced events, one session at a time, as they were registered at
        their origin (a Syncer client stores several sessions at once)."""
        for session in _sessions(events):
            self._deliver(session)

    async def aclose(self) -> None:
        """Deliver no more, and stop hearing of the engine's sessions."""
        self._closed = True
        tasks = [task for task in (self._poller, self._catching_up) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._remove_callback()

    def _from_engine_thread(self, events: list[StoredEvent]) -> None:
        """Engine callback, once per stored session: from the write thread, or on the loop
        for an inline group.

        From the thread, a batch joins the ones waiting to cross, and only the first of them
        wakes the loop: a group of a thousand fire-and-forget registrations crosses in one
        wake-up (a write to the loop's self-pipe each cost more than storing the event).
        They are delivered in the order stored, before the group's own completion, which is
        scheduled after them."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._deliver(events)
            return
        with self._crossing_lock:
            self._crossing.append(events)
            if len(self._crossing) > 1:
                return  # the wake-up of the first is still pending
        self._loop.call_soon_threadsafe(self._deliver_crossed)

    def _deliver_crossed(self) -> None:
        with self._crossing_lock:
            batches, self._crossing = self._crossing, []
        for events in batches:
            self._deliver(events)

    def _deliver(self, events: list[StoredEvent]) -> None:
        """A newly stored batch, in the order the writes were made (on the loop)."""
        if self._closed:
            return
        if self._catching_up is not None or self._stalled:
            self._waiting.append(events)
            return
        fresh = [event for event in events if event.position > self._delivered]
        if not fresh:
            return
        if fresh[0].position != self._delivered + 1:
            self._waiting.append(fresh)
            self._catch_up()
            return
        self._delivered = fresh[-1].position
        self._emit(fresh)

    def _catch_up(self) -> None:
        if self._catching_up is None:
            self._catching_up = self._loop.create_task(self._read_gap())

    async def _read_gap(self) -> None:
        """Deliver everything stored after the last delivered position, from the store."""
        try:
            while True:
                rows = await self._loop.run_in_executor(
                    self._readers, self._store.read, self._delivered, 1000
                )
                for session in _sessions(rows):
                    self._delivered = session[-1].position
                    self._emit(session)
                if len(rows) < 1000:
                    break
        except Exception:
            log.exception("cannot read the store's new events; retrying at the next poll")
            self._stalled = True
        finally:
            self._catching_up = None
            if not self._stalled:
                waiting, self._waiting = self._waiting, []
                for events in waiting:
                    self._deliver(events)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.POLL_SECONDS)
            try:
                last = await self._loop.run_in_executor(self._readers, self._store.last_position)
            except Exception:
                log.exception("cannot read the store's last position")
                continue
            if self._catching_up is None and (self._stalled or last > self._delivered):
                self._stalled = False
                self._catch_up()


def _sessions(events: list[StoredEvent]) -> list[list[StoredEvent]]:
    """``events`` cut where the (server, session) changes: one batch per stored session."""
    batches: list[list[StoredEvent]] = []
    for event in events:
        key = (event.id.server, event.id.session)
        if batches and (batches[-1][0].id.server, batches[-1][0].id.session) == key:
            batches[-1].append(event)
        else:
            batches.append([event])
    return batches
