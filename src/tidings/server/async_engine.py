"""The engine as the network servers (Eventer, Syncer) use it: from asyncio.

The engine and the store are synchronous and do blocking database work, so they run off the
event loop. Writes (register sessions, synced events, engine status events) go through one
FIFO queue served by one worker thread: they happen strictly in the order they were
submitted, and registrations waiting together are stored in one transaction (group commit,
:meth:`Engine.register_many`), each still its own session. A busy server thus pays one
commit per group rather than per request, while an idle one answers a single request at
once. Small groups on SQLite without modules are written on the event loop itself, where a
thread hop would cost more than the write, and only when no other writer holds the
database: they block the loop for about as long as one SQLite commit, never for a lock.

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
stops the server (:meth:`wait_broken`) for the same reason.

Reads (queries, syncer backlogs) run in a small pool of their own, so a long query
never delays registration. Bulk reads (query replies that may hold every event of the store)
run in a smaller pool still, so that however many of them clients ask for at once, short
queries find a free reader. Listeners hear of every newly stored batch on the event loop, in
storage order, whether it came from a local session or from a peer server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from tidings.errors import EngineError, StoreBusy
from tidings.events.model import NewEvent, StoredEvent
from tidings.server.engine import Engine
from tidings.server.store import EventStore

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Told, on the event loop, of each batch of newly stored events (one session, or one batch
#: of synced events), in storage order.
Listener = Callable[[list[StoredEvent]], None]

#: Bounds of one group commit: requests and events per transaction.
MAX_GROUP_REQUESTS = 1000
MAX_GROUP_EVENTS = 50_000
#: Groups up to this many events and payload bytes are written on the event loop itself
#: (SQLite, no modules, lock free): handing them to the write thread and back costs about
#: 300 µs of thread switching, a large share of such a write (~20 µs an event); the loop
#: is held for at most a few milliseconds.
INLINE_GROUP_EVENTS = 128
INLINE_GROUP_BYTES = 128 * 1024


@dataclass(slots=True)
class _Register:
    events: Sequence[NewEvent]
    future: asyncio.Future[list[StoredEvent | None]]
    #: May be tried on the loop; not if that was tried already and found the store busy
    #: (each try runs the session's checks again, and logs the events they refuse).
    inline: bool = True


@dataclass(slots=True)
class _Call:
    function: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    #: Run on the loop with the result before the next write starts (keeps listeners in
    #: storage order).
    then: Callable[[Any], None] | None = None
    #: Writes through the store's (held) register transaction, or none; other writes (synced
    #: events among them) take a transaction of their own, so held writes are committed
    #: before them.
    held: bool = False


class AsyncEngine:
    """Runs an :class:`Engine` for asyncio code; create it on the loop that will use it."""

    def __init__(
        self,
        engine: Engine,
        query_workers: int = 4,
        bulk_workers: int = 2,
        flush_period: float | None = None,
    ) -> None:
        if flush_period is not None and not flush_period > 0:
            raise EngineError(f"flush_period must be > 0 seconds, not {flush_period!r}")
        self.engine = engine
        self._loop = asyncio.get_running_loop()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="tidings-register")
        self._readers = ThreadPoolExecutor(query_workers, thread_name_prefix="tidings-query")
        self._bulk = ThreadPoolExecutor(bulk_workers, thread_name_prefix="tidings-bulk")
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
            engine.store.hold_writes(self._held_opened, self._held_committed)
        self._jobs: deque[_Register | _Call] = deque()
        self._draining: asyncio.Task[None] | None = None
        #: A group is being written on the loop (:meth:`_write_inline`).
        self._writing_inline = False
        #: Batches stored by the write thread, waiting for the loop to deliver them (the
        #: sessions of one group cross to the loop in one wake-up, see _from_engine_thread).
        self._crossing: list[list[StoredEvent]] = []
        self._crossing_lock = threading.Lock()
        self._remove_callback = engine.on_registered(self._from_engine_thread)
        self._inline = engine.store.backend == "sqlite"
        self._stream = _StoreStream(self, engine.store.last_position())

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
        listeners = self._early if early else self._listeners
        listeners.append(listener)

        def remove() -> None:
            if listener in listeners:
                listeners.remove(listener)

        return remove

    def submit(
        self, events: Sequence[NewEvent], *, more_coming: bool = False
    ) -> asyncio.Future[list[StoredEvent | None]]:
        """Queue one processing session (see :meth:`Engine.register`) and return its future.

        Sessions are stored in the order they are submitted, so a caller may submit several
        before awaiting any (a connection's pipelined fire-and-forget registrations); with
        ``more_coming`` (the caller has more requests waiting) it is queued even when it
        could be written at once, so that it is stored in one group with the ones after it.
        """
        future: asyncio.Future[list[StoredEvent | None]] = self._loop.create_future()
        job = _Register(events, future)
        if more_coming or not self._idle():
            self._enqueue(job)
        elif self._write_inline([job]):
            # Nothing queued or running: written now, as the drain would have done at its
            # next turn, without a task and a loop turn per request.
            self._check_store()
        else:
            job.inline = False
            self._enqueue(job)
        return future

    async def register(self, events: Sequence[NewEvent]) -> list[StoredEvent | None]:
        """One processing session (see :meth:`Engine.register`)."""
        return await self.submit(events)

    async def register_synced(self, events: Sequence[StoredEvent]) -> list[StoredEvent]:
        """Store events that a peer server registered, with their own ids.

        They are not run through modules again (the origin server did that); listeners are
        told of the ones that were new here.
        """
        future: asyncio.Future[list[StoredEvent]] = self._loop.create_future()
        self._enqueue(
            _Call(self.engine.store.append_synced, (events,), future, self._deliver_sessions)
        )
        return await future

    def _deliver_sessions(self, events: list[StoredEvent]) -> None:
        """Newly stored synced events to the listeners one session at a time, as they were
        registered at their origin (a Syncer client stores several sessions at once)."""
        for session in _sessions(events):
            self._stream.deliver(session)

    async def write(self, function: Callable[..., T], *args: object) -> T:
        """Run ``function`` in the write thread, after every write queued before it."""
        future: asyncio.Future[T] = self._loop.create_future()
        self._enqueue(_Call(function, args, future))
        return await future

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
        """Return (why) once the store has lost answered registrations it held for the next
        commit (``durability: periodic``, a database error): it takes no more writes and
        the server stops; a restart starts from what is committed."""
        await self._broken.wait()
        return self.store.failed or "the event store lost held registrations"

    async def flush(self) -> None:
        """Commit the registrations the store holds (``durability: periodic``), after every
        write queued before."""
        if self._flush_period is not None:
            await self._enqueue_flush()

    async def aclose(self) -> None:
        """Finish queued writes and commit them, then stop the threads; the engine itself
        stays open."""
        if self._draining is not None:
            await asyncio.shield(self._draining)
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        try:
            if self.store.failed is None:
                await self.flush()
        finally:
            await self._close_threads()

    async def _close_threads(self) -> None:
        await self._stream.aclose()
        self._remove_callback()
        await self._loop.run_in_executor(None, self._writer.shutdown, True)
        await self._loop.run_in_executor(None, self._readers.shutdown, True)
        await self._loop.run_in_executor(None, self._bulk.shutdown, True)

    def _enqueue(self, job: _Register | _Call) -> None:
        self._jobs.append(job)
        if self._draining is None or self._draining.done():
            self._draining = self._loop.create_task(self._drain(), name="tidings-writes")

    async def _drain(self) -> None:
        """Serve queued writes in order: runs of registrations as one group each."""
        while self._jobs:
            job = self._jobs.popleft()
            try:
                await self._run_job(job)
            finally:
                self._check_store()

    def _check_store(self) -> None:
        """After each write: arm the flush clock, or, if held writes were lost, forget what
        the durable listeners were to hear of them and signal that the server must stop."""
        if self.store.failed is None:
            self._schedule_flush()
            return
        self._uncommitted.clear()
        if not self._broken.is_set():
            log.error("event store: %s; the server stops", self.store.failed)
            self._broken.set()

    async def _run_job(self, job: _Register | _Call) -> None:
        """One queued write; a registration takes the ones queued right behind it along
        (one group)."""
        if isinstance(job, _Call):
            await self._run_call(job)
            return
        group = [job]
        events = len(job.events)
        while (
            self._jobs
            and isinstance(self._jobs[0], _Register)
            and len(group) < MAX_GROUP_REQUESTS
            and events + len(self._jobs[0].events) <= MAX_GROUP_EVENTS
        ):
            job = self._jobs.popleft()  # type: ignore[assignment]
            group.append(job)
            events += len(job.events)
        await self._run_group(group)

    async def _run_call(self, job: _Call) -> None:
        try:
            if not job.held and self.store.unflushed:
                await self._loop.run_in_executor(self._writer, self.store.flush)
            result = await self._loop.run_in_executor(self._writer, job.function, *job.args)
        except Exception as exc:
            _settle(job.future, exception=exc)
            return
        if job.then is not None:
            job.then(result)
        _settle(job.future, result=result)

    def _schedule_flush(self) -> None:
        """Start the flush period's clock at the first held write after a commit."""
        if self._flush_period is None or self._flush_timer is not None:
            return
        if self.store.unflushed:
            self._flush_timer = self._loop.call_later(self._flush_period, self._timed_flush)

    def _timed_flush(self) -> None:
        self._flush_timer = None
        self._enqueue_flush().add_done_callback(_log_flush_failure)

    def _enqueue_flush(self) -> asyncio.Future[None]:
        """Queue a commit of the held writes behind the writes queued so far."""
        future: asyncio.Future[None] = self._loop.create_future()
        self._enqueue(_Call(self.store.flush, (), future, held=True))
        return future

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
        everything = self._flush_period is None or not self.store.unflushed
        # Read after ``unflushed``: a rollback in another thread sets ``failed`` before it
        # closes the transaction, so a transaction seen closed by a rollback is seen failed.
        if self.store.failed is not None:
            return
        waiting = self._uncommitted
        while waiting and (everything or waiting[0][-1].position <= self._durable_through):
            self._tell(self._listeners, waiting.popleft())

    async def _run_group(self, group: list[_Register]) -> None:
        if self._write_inline(group):
            return
        try:
            results = await self._loop.run_in_executor(
                self._writer, self.engine.register_many, [job.events for job in group]
            )
        except Exception as exc:
            _settle_group(group, exc)
            return
        _settle_group(group, results)

    def _idle(self) -> bool:
        """No write is queued or running (nor being written inline right now)."""
        return (
            not self._jobs
            and not self._writing_inline
            and (self._draining is None or self._draining.done())
        )

    def _write_inline(self, group: list[_Register]) -> bool:
        """Write a small group on the loop if that cannot block it, settling its futures;
        False if it must go to the write thread.

        Only on SQLite (a PostgreSQL write is network round trips), only without modules
        (user code may block, and a retry in the thread must not run it twice), only if
        small, and only if no other writer holds the database (``wait=False``).
        """
        requests = [job.events for job in group]
        if (
            not self._inline
            or not all(job.inline for job in group)
            or self.engine.has_modules
            or sum(len(events) for events in requests) > INLINE_GROUP_EVENTS
            or sum(len(e.payload or b"") for events in requests for e in events)
            > INLINE_GROUP_BYTES
        ):
            return False
        self._writing_inline = True  # a listener's own write waits its turn in the queue
        try:
            results = self.engine.register_many(requests, wait=False)
        except StoreBusy:
            return False
        except Exception as exc:
            _settle_group(group, exc)
            return True
        finally:
            self._writing_inline = False
        _settle_group(group, results)
        return True

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
            self._stream.deliver(events)
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
            self._stream.deliver(events)

    def _emit(self, events: list[StoredEvent]) -> None:
        """Tell every listener of one batch (called by the stream, in position order): the
        early ones now, the others once it is committed (in the same order)."""
        self._tell(self._early, events)
        self._uncommitted.append(events)
        self._release()

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


def _settle_group(
    group: list[_Register], outcome: Exception | list[list[StoredEvent | None] | EngineError]
) -> None:
    """Complete each registration of a group with its result or error, or all with one
    error (the group's write failed)."""
    if isinstance(outcome, Exception):
        for job in group:
            _settle(job.future, exception=outcome)
        return
    for job, result in zip(group, outcome, strict=True):
        if isinstance(result, EngineError):
            _settle(job.future, exception=result)
        else:
            _settle(job.future, result=result)


def _settle(
    future: asyncio.Future[Any], *, result: Any = None, exception: BaseException | None = None
) -> None:
    """Complete ``future`` unless its waiter gave up (cancelled) meanwhile."""
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)


class _StoreStream:
    """Delivers the store's new events to the listeners once each, in position order.

    Batches come from our own writes, but other processes may append to the same database
    (a relay's event-store target, a second store). Positions are dense, so a batch that
    does not start right after the last delivered position shows such a gap: the missing
    events are read from the store first, grouped by session, and batches arriving
    meanwhile wait their turn. An idle server looks for outside writes every
    ``POLL_SECONDS``. Subscribers and Syncer peers therefore see every stored event.
    """

    POLL_SECONDS = 0.5

    def __init__(self, engine: AsyncEngine, last_position: int) -> None:
        self._engine = engine
        self._delivered = last_position
        self._waiting: list[list[StoredEvent]] = []
        self._catching_up: asyncio.Task[None] | None = None
        #: The last catch-up failed (the database is unreachable): batches wait for the
        #: next poll to retry, rather than retrying at once on every write.
        self._stalled = False
        self._closed = False
        self._poller = asyncio.get_running_loop().create_task(self._poll(), name="tidings-poll")

    def deliver(self, events: list[StoredEvent]) -> None:
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
        self._engine._emit(fresh)

    async def aclose(self) -> None:
        self._closed = True
        tasks = [task for task in (self._poller, self._catching_up) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _catch_up(self) -> None:
        if self._catching_up is None:
            self._catching_up = asyncio.get_running_loop().create_task(self._read_gap())

    async def _read_gap(self) -> None:
        """Deliver everything stored after the last delivered position, from the store."""
        try:
            while True:
                rows = await self._engine.read(
                    self._engine.store.read, self._delivered, 1000, committed=True
                )
                for session in _sessions(rows):
                    self._delivered = session[-1].position
                    self._engine._emit(session)
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
                    self.deliver(events)

    async def _poll(self) -> None:
        store = self._engine.store
        while True:
            await asyncio.sleep(self.POLL_SECONDS)
            try:
                last = await self._engine.read(store.last_position, committed=True)
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
