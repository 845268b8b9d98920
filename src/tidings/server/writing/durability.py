"""When a write is durable, and who hears of it when: the two tiers of listeners.

With ``flush_period`` (the server's ``durability: periodic``) registrations are answered
once written into a transaction the store keeps open, and committed at most
``flush_period`` seconds later (hat-event's lmdb backend answers from memory and writes every
``flush_period`` the same way). What a crash of the process can lose is the writes since the
last commit: always whole sessions at the end of the log, never one in the middle. The
Syncer peers, the streams and the metrics (*durable* listeners) hear of a batch only once it
is committed, so a peer server never holds an event its origin lost, and queries commit what
is held first. The Eventer's subscribers (*early* listeners) are told at once, as hat-event's
lmdb backend tells them: a subscriber may hear of a session that a crash then takes back, and
after the restart the same session number and positions carry a new session (reconnect and
query, as after any disconnect). A database error that loses held writes without a crash
stops the server (:meth:`Durability.wait_broken`) for the same reason.

Without ``flush_period`` (``durability: commit``) every write is committed before it is
answered, and both tiers hear of a batch at the same moment. Either way listeners hear of
every newly stored batch on the event loop, in storage order (the change feed,
:mod:`tidings.server.change_feed`, brings them here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from tidings.errors import EngineError
from tidings.events.model import StoredEvent
from tidings.server.store import EventStore

log = logging.getLogger(__name__)

#: Told, on the event loop, of each batch of newly stored events (one session, or one batch
#: of synced events), in storage order.
Listener = Callable[[list[StoredEvent]], None]


class Durability:
    """The commit clock of held writes and the listeners of one store; create it on the loop
    that will use it. ``queue_flush`` queues a commit of the held writes behind the writes
    queued so far (in the write queue) and returns its future."""

    def __init__(
        self,
        store: EventStore,
        flush_period: float | None,
        queue_flush: Callable[[], asyncio.Future[None]],
    ) -> None:
        if flush_period is not None and not flush_period > 0:
            raise EngineError(f"flush_period must be > 0 seconds, not {flush_period!r}")
        self._store = store
        self._loop = asyncio.get_running_loop()
        self._queue_flush = queue_flush
        self._listeners: list[Listener] = []
        self._early: list[Listener] = []
        #: Batches told to early listeners, waiting for their commit to reach the others.
        self._uncommitted: deque[list[StoredEvent]] = deque()
        #: The last position a commit of held writes made durable (as the store said).
        self._durable_through = 0
        self._flush_period = flush_period
        self._flush_timer: asyncio.TimerHandle | None = None
        #: Set when the store lost held registrations: the server must stop (see
        #: :meth:`wait_broken`).
        self._broken = asyncio.Event()
        if flush_period is not None:
            store.hold_writes(self._held_opened, self._held_committed)

    def subscribe(self, listener: Listener, *, early: bool = False) -> Callable[[], None]:
        """Call ``listener`` with every newly stored batch; returns a function removing it.

        An ``early`` listener hears of a batch as soon as it is written, the others once it
        is committed (the same moment unless the server's durability is ``periodic``)."""
        listeners = self._early if early else self._listeners
        listeners.append(listener)

        def remove() -> None:
            if listener in listeners:
                listeners.remove(listener)

        return remove

    def emit(self, events: list[StoredEvent]) -> None:
        """Tell every listener of one batch (called by the change feed, in position order):
        the early ones now, the others once it is committed (in the same order)."""
        self._tell(self._early, events)
        self._uncommitted.append(events)
        self._release()

    async def flush(self) -> None:
        """Commit the registrations the store holds (``durability: periodic``), after every
        write queued before."""
        if self._flush_period is not None:
            await self._queue_flush()

    async def wait_broken(self) -> str:
        """Return (why) once the store has lost answered registrations it held for the next
        commit (``durability: periodic``, a database error): it takes no more writes and
        the server stops; a restart starts from what is committed."""
        await self._broken.wait()
        return self._store.failed or "the event store lost held registrations"

    def after_write(self) -> None:
        """After each write: arm the flush clock, or, if held writes were lost, forget what
        the durable listeners were to hear of them and signal that the server must stop."""
        if self._store.failed is None:
            self._schedule_flush()
            return
        self._uncommitted.clear()
        if not self._broken.is_set():
            log.error("event store: %s; the server stops", self._store.failed)
            self._broken.set()

    def stop_clock(self) -> None:
        """No more timed commits (the server closes; its last commit is an explicit flush)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None

    def _schedule_flush(self) -> None:
        """Start the flush period's clock at the first held write after a commit."""
        if self._flush_period is None or self._flush_timer is not None:
            return
        if self._store.unflushed:
            self._flush_timer = self._loop.call_later(self._flush_period, self._timed_flush)

    def _timed_flush(self) -> None:
        self._flush_timer = None
        self._queue_flush().add_done_callback(_log_flush_failure)

    def _held_opened(self) -> None:
        """Store callback (any thread, the writer's lock held): a held transaction began.
        Writes that do not come through the queue (a module's own sessions) begin one too,
        and the flush clock must run for them as well."""
        self._from_store(self._schedule_flush)

    def _held_committed(self, through: int | None) -> None:
        """Store callback (any thread, the writer's lock held): held writes up to position
        ``through`` were committed, by a flush of ours or by any transaction of the store's
        own (a stream consumer's acknowledgement, retention), which commits them first."""
        self._from_store(self._committed, through)

    def _from_store(self, callback: Callable[..., None], *args: object) -> None:
        """Run ``callback`` on the loop at its next turn, never inside the store's lock."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to tell
            self._loop.call_soon_threadsafe(callback, *args)

    def _committed(self, through: int | None) -> None:
        """Held writes up to position ``through`` are durable: the durable listeners hear of
        the batches waiting for that, and only of them (a write stored after the commit,
        before this turn, waits for its own)."""
        if through is not None and through > self._durable_through:
            self._durable_through = through
        self._release()

    def _release(self) -> None:
        """Tell the durable listeners, in order, of the waiting batches that are committed:
        all of them when no held transaction is open (every write before now has been
        committed), else those up to the last committed position; none once held writes
        were lost (nobody who keeps what they hear may hear of them)."""
        everything = self._flush_period is None or not self._store.unflushed
        # Read after ``unflushed``: a rollback in another thread sets ``failed`` before it
        # closes the transaction, so a transaction seen closed by a rollback is seen failed.
        if self._store.failed is not None:
            return
        waiting = self._uncommitted
        while waiting and (everything or waiting[0][-1].position <= self._durable_through):
            self._tell(self._listeners, waiting.popleft())

    @staticmethod
    def _tell(listeners: list[Listener], events: list[StoredEvent]) -> None:
        for listener in list(listeners):
            try:
                listener(events)
            except Exception:
                log.exception("stored-events listener %r failed", listener)


def _log_flush_failure(future: asyncio.Future[None]) -> None:
    """A timed flush has no waiter: its failure is logged (the next flush retries)."""
    if not future.cancelled() and future.exception() is not None:
        log.error("event store: cannot commit held registrations: %s", future.exception())
