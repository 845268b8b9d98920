"""The engine as the network servers (Eventer, Syncer) and the streams use it: from asyncio.

The engine and the store are synchronous and do blocking database work, so they run off the
event loop. :class:`AsyncEngine` puts three parts together, each with its own contract:

- writes go through the write queue (:mod:`tidings.server.writing.queue`): one FIFO served
  by one thread, registrations waiting together stored in one group commit;
- the durability (:mod:`tidings.server.writing.durability`) says when a write is committed
  (``durability: periodic`` holds it for up to ``flush_period``) and which listeners hear of
  it when: the Eventer's subscribers at once, the Syncer peers, streams and metrics once it
  is committed; a store that lost held writes stops the server;
- the change feed (:mod:`tidings.server.change_feed`) brings every newly stored batch, from
  this server's writes, its Syncer clients or another process on the same database, to the
  listeners once, in storage order.

Reads (queries, syncer backlogs) run in a small pool of their own, so a long query
never delays registration. Bulk reads (query replies that may hold every event of the store)
run in a smaller pool still, so that however many of them clients ask for at once, short
queries find a free reader. A read sees every answered registration: held ones are
committed first.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from tidings.events.model import NewEvent, StoredEvent
from tidings.events.sources import ENGINE_SOURCE, Source
from tidings.server.change_feed import ChangeFeed
from tidings.server.engine import Engine
from tidings.server.store import EventStore
from tidings.server.writing.durability import Durability, Listener
from tidings.server.writing.queue import WriteQueue

T = TypeVar("T")


class AsyncEngine:
    """Runs an :class:`Engine` for asyncio code; create it on the loop that will use it."""

    def __init__(
        self,
        engine: Engine,
        query_workers: int = 4,
        bulk_workers: int = 2,
        flush_period: float | None = None,
    ) -> None:
        self.engine = engine
        self._loop = asyncio.get_running_loop()
        self._durability = Durability(engine.store, flush_period, self._queue_flush)
        self._queue = WriteQueue(engine, self._durability.after_write)
        self._readers = ThreadPoolExecutor(query_workers, thread_name_prefix="tidings-query")
        self._bulk = ThreadPoolExecutor(bulk_workers, thread_name_prefix="tidings-bulk")
        self._feed = ChangeFeed(engine, self._readers, self._durability.emit)
        engine.set_submitter(self._submit_threadsafe)
        self._fault: asyncio.Future[str] = self._loop.create_future()
        engine.on_fault(self._fault_threadsafe)

    @property
    def store(self) -> EventStore:
        return self.engine.store

    @property
    def server_id(self) -> int:
        return self.engine.store.server_id

    def subscribe(self, listener: Listener, *, early: bool = False) -> Callable[[], None]:
        """Call ``listener`` with every newly stored batch; returns a function removing it.

        An ``early`` listener hears of a batch as soon as it is written, the others once it
        is committed (the same moment unless the server's durability is ``periodic``)."""
        return self._durability.subscribe(listener, early=early)

    def submit(
        self,
        events: Sequence[NewEvent],
        *,
        source: Source = ENGINE_SOURCE,
        more_coming: bool = False,
    ) -> asyncio.Future[list[StoredEvent | None]]:
        """Queue one processing session registered by ``source`` (see
        :meth:`WriteQueue.submit`) and return its future."""
        return self._queue.submit(events, source=source, more_coming=more_coming)

    async def register(
        self, events: Sequence[NewEvent], source: Source = ENGINE_SOURCE
    ) -> list[StoredEvent | None]:
        """One processing session registered by ``source`` (see :meth:`Engine.register`)."""
        return await self.submit(events, source=source)

    def _submit_threadsafe(
        self, events: Sequence[NewEvent], source: Source
    ) -> concurrent.futures.Future[list[StoredEvent | None]]:
        """:meth:`Engine.submit` from any thread (a module's own registrations): through the
        write queue, on this engine's loop."""
        return asyncio.run_coroutine_threadsafe(self.register(events, source), self._loop)

    async def register_synced(self, events: Sequence[StoredEvent]) -> list[StoredEvent]:
        """Store events that a peer server registered, with their own ids.

        They are not run through modules again (the origin server did that); listeners are
        told of the ones that were new here.
        """
        return await self._queue.call(
            self.store.append_synced, (events,), then=self._feed.deliver_synced
        )

    async def write(self, function: Callable[..., T], *args: object) -> T:
        """Run ``function`` in the write thread, after every write queued before it."""
        return await self._queue.call(function, args)

    async def read(
        self,
        function: Callable[..., T],
        *args: object,
        bulk: bool = False,
        committed: bool = False,
    ) -> T:
        """Run a read-only ``function`` in the query pool, or in the bulk pool if it may
        read a large part of the store. It sees every answered registration: held ones are
        committed first, unless ``committed`` says only committed events are wanted."""
        if not committed and self.store.unflushed:
            await self.flush()
        pool = self._bulk if bulk else self._readers
        return await self._loop.run_in_executor(pool, function, *args)

    async def wait_broken(self) -> str:
        """Return (why) once the store has lost answered registrations it held (see
        :meth:`Durability.wait_broken`), or the engine faulted (a module closed itself, see
        :meth:`Engine.report_fault`): the server stops."""
        lost = asyncio.ensure_future(self._durability.wait_broken())
        try:
            await asyncio.wait([lost, self._fault], return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        return self._fault.result() if self._fault.done() else lost.result()

    def _fault_threadsafe(self, reason: str) -> None:
        self._loop.call_soon_threadsafe(self._set_fault, reason)

    def _set_fault(self, reason: str) -> None:
        if not self._fault.done():
            self._fault.set_result(reason)

    async def flush(self) -> None:
        """Commit the registrations the store holds (``durability: periodic``), after every
        write queued before."""
        await self._durability.flush()

    async def aclose(self) -> None:
        """Finish queued writes and commit them, then stop the threads; the engine itself
        stays open."""
        await self._queue.finish()
        self._durability.stop_clock()
        try:
            if self.store.failed is None:
                await self.flush()
        finally:
            await self._close_threads()

    async def _close_threads(self) -> None:
        self.engine.set_submitter(None)
        await self._feed.aclose()
        await self._queue.aclose()
        await self._loop.run_in_executor(None, self._readers.shutdown, True)
        await self._loop.run_in_executor(None, self._bulk.shutdown, True)

    def _queue_flush(self) -> asyncio.Future[None]:
        """Queue a commit of the held writes behind the writes queued so far."""
        return self._queue.call(self.store.flush, (), held=True)
