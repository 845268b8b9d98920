"""Taking in the consumer events the other servers of the group wrote to the log.

Every server of a redundant group tells the others of its consumers by writing consumer
events (:mod:`.replication`); the Syncer copies them with the rest of the log. This reads
them back in position order from where it last stopped (kept in the store, so a server
that was down or not serving catches up at start-up) and applies the peers' ones to the
local consumers (:meth:`.positions.Consumers.apply`). A server's own consumer events are
skipped: it applied them when it wrote them. A peer's event that is malformed, out of the
database's ranges, or not written by the server its type names
(:func:`.replication.read_consumer_event`) is skipped with a warning, and an unexpected
failure is logged and retried: one bad event never stops the sync.

It runs while the streams run, woken by the engine's listener when a batch holds a peer's
consumer event; with a Monitor, that is while the server is blessed, and the catch-up at
start covers the time it was not.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from tidings.errors import StoreError, StreamError
from tidings.events.model import StoredEvent
from tidings.server.store import EventStore
from tidings.server.store.positions import read_positions
from tidings.streams.consumers.positions import Consumers
from tidings.streams.consumers.replication import CONSUMER_PATTERN, read_consumer_event
from tidings.streams.typemap import is_consumer_type

log = logging.getLogger(__name__)

#: Consumer events read per step.
_STEP = 500
#: Seconds before trying again after the store failed.
_RETRY = 1.0


class ConsumerSync:
    """See the module docstring: :meth:`notice` is the engine listener, :meth:`run` the
    task."""

    def __init__(self, store: EventStore, consumers: Consumers, executor: Executor) -> None:
        self._store = store
        self._consumers = consumers
        self._executor = executor
        self._wake = asyncio.Event()

    def notice(self, events: list[StoredEvent]) -> None:
        """Wake :meth:`run` if ``events`` hold a peer's consumer event."""
        own = self._store.server_id
        if any(is_consumer_type(e.type) and e.id.server != own for e in events):
            self._wake.set()

    async def run(self) -> None:
        """Catch up now, then each time :meth:`notice` wakes it, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            try:
                await loop.run_in_executor(self._executor, self.catch_up)
            except StoreError as exc:
                log.warning("stream consumer sync failed", extra={"error": str(exc)})
                await asyncio.sleep(_RETRY)
                continue
            except Exception as exc:  # a bug: logged, and tried again rather than dead
                log.error("stream consumer sync failed unexpectedly", exc_info=exc)
                await asyncio.sleep(_RETRY)
                continue
            await self._wake.wait()

    def catch_up(self) -> int:
        """Apply the peers' consumer events after the last applied one (blocking); how many
        were applied."""
        own = self._store.server_id
        after = self._consumers.synced()
        applied = 0
        while True:
            found = read_positions(self._store, after, _STEP, [CONSUMER_PATTERN])
            for event in found.events:
                if event.id.server == own:
                    continue
                # A malformed or forged event is passed over (the position below moves past
                # it): it must not stop the sync for the events after it.
                try:
                    stream, user, component, covers = read_consumer_event(event)
                except StreamError as exc:
                    log.warning("peer consumer event skipped", extra={"error": str(exc)})
                    continue
                self._consumers.apply(stream, user, component, covers)
                applied += 1
            if found.scanned <= after:
                return applied
            self._consumers.set_synced(found.scanned)
            after = found.scanned
            if len(found.events) < _STEP:
                return applied
