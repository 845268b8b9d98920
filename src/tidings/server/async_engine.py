"""The engine as the network servers (Eventer, Syncer) use it: from asyncio.

The engine and the store are synchronous and do blocking database work, so they run off the
event loop: every write (a register session, a batch of synced events) in ONE worker thread,
which keeps sessions strictly one after another in arrival order, and reads (queries, syncer
backlogs) in a small pool of their own, so that a long query never delays registration.
Subscribers hear of every newly stored batch on the event loop, in storage order, whether it
came from a local session or from a peer server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from tidings.server.engine import Engine
from tidings.server.query import QueryData, query_events
from tidings.server.store import EventStore, NewEvent, StoredEvent

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Told, on the event loop, of each batch of newly stored events (one session, or one batch
#: of synced events), in storage order.
Listener = Callable[[list[StoredEvent]], None]


class AsyncEngine:
    """Runs an :class:`Engine` for asyncio code; create it on the loop that will use it."""

    def __init__(self, engine: Engine, query_workers: int = 4) -> None:
        self.engine = engine
        self._loop = asyncio.get_running_loop()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="tidings-register")
        self._readers = ThreadPoolExecutor(query_workers, thread_name_prefix="tidings-query")
        self._listeners: list[Listener] = []
        self._remove_callback = engine.on_registered(self._from_engine_thread)

    @property
    def store(self) -> EventStore:
        return self.engine.store

    @property
    def server_id(self) -> int:
        return self.engine.store.server_id

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` with every newly stored batch; returns a function removing it."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    async def register(self, events: Sequence[NewEvent]) -> list[StoredEvent | None]:
        """One processing session (see :meth:`Engine.register`)."""
        return await self._loop.run_in_executor(self._writer, self.engine.register, events)

    async def register_synced(self, events: Sequence[StoredEvent]) -> list[StoredEvent]:
        """Store events that a peer server registered, with their own ids.

        They are not run through modules again (the origin server did that); listeners are
        told of the ones that were new here.
        """
        stored = await self._loop.run_in_executor(
            self._writer, self.engine.store.append_synced, events
        )
        if stored:
            self._publish(stored)
        return stored

    async def write(self, function: Callable[..., T], *args: object) -> T:
        """Run ``function`` in the write thread, after every write queued before it."""
        return await self._loop.run_in_executor(self._writer, function, *args)

    async def read(self, function: Callable[..., T], *args: object) -> T:
        """Run a read-only ``function`` in the query pool."""
        return await self._loop.run_in_executor(self._readers, function, *args)

    async def query(self, query: QueryData) -> list[StoredEvent]:
        return await self.read(query_events, self.engine.store, query)

    async def aclose(self) -> None:
        """Finish queued writes, then stop the threads; the engine itself stays open."""
        self._remove_callback()
        await self._loop.run_in_executor(None, self._writer.shutdown, True)
        await self._loop.run_in_executor(None, self._readers.shutdown, True)

    def _from_engine_thread(self, events: list[StoredEvent]) -> None:
        self._loop.call_soon_threadsafe(self._publish, events)

    def _publish(self, events: list[StoredEvent]) -> None:
        for listener in list(self._listeners):
            try:
                listener(events)
            except Exception:
                log.exception("stored-events listener %r failed", listener)
