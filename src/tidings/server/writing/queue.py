"""The write queue: every write of the server in one FIFO, registrations in group commits.

The engine and the store are synchronous and do blocking database work, so they run off the
event loop. Writes (register sessions, synced events, engine status events) go through one
FIFO queue served by one worker thread: they happen strictly in the order they were
submitted, and registrations waiting together are stored in one transaction (group commit,
:meth:`Engine.register_many`), each still its own session. A busy server thus pays one
commit per group rather than per request, while an idle one answers a single request at
once. Small groups on SQLite without modules are written on the event loop itself, where a
thread hop would cost more than the write, and only when no other writer holds the
database: they block the loop for about as long as one SQLite commit, never for a lock.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from tidings.errors import EngineError, StoreBusy
from tidings.events.model import NewEvent, StoredEvent
from tidings.events.sources import ENGINE_SOURCE, Source
from tidings.server.engine import Engine

T = TypeVar("T")

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
    source: Source
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


class WriteQueue:
    """The writes of one :class:`Engine`, in submission order; create it on the loop that
    will use it. ``after_write`` is called on the loop after every write (the durability's
    look at the store, :meth:`~tidings.server.writing.durability.Durability.after_write`)."""

    def __init__(self, engine: Engine, after_write: Callable[[], None]) -> None:
        self._engine = engine
        self._after_write = after_write
        self._loop = asyncio.get_running_loop()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="tidings-register")
        self._jobs: deque[_Register | _Call] = deque()
        self._draining: asyncio.Task[None] | None = None
        #: A group is being written on the loop (:meth:`_write_inline`).
        self._writing_inline = False
        self._inline = engine.store.backend == "sqlite"

    def submit(
        self,
        events: Sequence[NewEvent],
        *,
        source: Source = ENGINE_SOURCE,
        more_coming: bool = False,
    ) -> asyncio.Future[list[StoredEvent | None]]:
        """Queue one processing session registered by ``source`` (see
        :meth:`Engine.register`) and return its future.

        Sessions are stored in the order they are submitted, so a caller may submit several
        before awaiting any (a connection's pipelined fire-and-forget registrations); with
        ``more_coming`` (the caller has more requests waiting) it is queued even when it
        could be written at once, so that it is stored in one group with the ones after it.
        """
        future: asyncio.Future[list[StoredEvent | None]] = self._loop.create_future()
        job = _Register(events, source, future)
        if more_coming or not self._idle():
            self._enqueue(job)
        elif self._write_inline([job]):
            # Nothing queued or running: written now, as the drain would have done at its
            # next turn, without a task and a loop turn per request.
            self._after_write()
        else:
            job.inline = False
            self._enqueue(job)
        return future

    def call(
        self,
        function: Callable[..., T],
        args: tuple[object, ...],
        *,
        then: Callable[[T], None] | None = None,
        held: bool = False,
    ) -> asyncio.Future[T]:
        """Queue ``function(*args)`` for the write thread, after every write queued before
        it. ``then`` runs on the loop with its result before the next write starts;
        ``held``: it writes through the store's held register transaction (a commit of it,
        say), so held writes are not committed before it as they are before other calls."""
        future: asyncio.Future[T] = self._loop.create_future()
        self._enqueue(_Call(function, args, future, then, held))
        return future

    async def finish(self) -> None:
        """Wait until the writes queued so far are done."""
        if self._draining is not None:
            await asyncio.shield(self._draining)

    async def aclose(self) -> None:
        """Stop the write thread (once the writes are finished)."""
        await self._loop.run_in_executor(None, self._writer.shutdown, True)

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
                self._after_write()

    async def _run_job(self, job: _Register | _Call) -> None:
        """One queued write; a registration takes the ones queued right behind it along
        (one group)."""
        if isinstance(job, _Call):
            await self._run_call(job)
            return
        group = [job]
        events = len(job.events)
        while self._jobs and len(group) < MAX_GROUP_REQUESTS:
            following = self._jobs[0]
            if (
                not isinstance(following, _Register)
                or events + len(following.events) > MAX_GROUP_EVENTS
            ):
                break
            self._jobs.popleft()
            group.append(following)
            events += len(following.events)
        await self._run_group(group)

    async def _run_call(self, job: _Call) -> None:
        store = self._engine.store
        try:
            if not job.held and store.unflushed:
                await self._loop.run_in_executor(self._writer, store.flush)
            result = await self._loop.run_in_executor(self._writer, job.function, *job.args)
        except Exception as exc:
            _settle(job.future, exception=exc)
            return
        if job.then is not None:
            job.then(result)
        _settle(job.future, result=result)

    async def _run_group(self, group: list[_Register]) -> None:
        if self._write_inline(group):
            return
        try:
            results = await self._loop.run_in_executor(
                self._writer,
                functools.partial(
                    self._engine.register_many,
                    [job.events for job in group],
                    sources=[job.source for job in group],
                ),
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
        if not self._inline or self._engine.has_modules or not _small(group):
            return False
        requests = [job.events for job in group]
        self._writing_inline = True  # a listener's own write waits its turn in the queue
        try:
            results = self._engine.register_many(
                requests, wait=False, sources=[job.source for job in group]
            )
        except StoreBusy:
            return False
        except Exception as exc:
            _settle_group(group, exc)
            return True
        finally:
            self._writing_inline = False
        _settle_group(group, results)
        return True


def _small(group: list[_Register]) -> bool:
    """Whether a group may be written on the loop: each job may (see ``_Register.inline``)
    and it is within :data:`INLINE_GROUP_EVENTS` and :data:`INLINE_GROUP_BYTES`."""
    events = size = 0
    for job in group:
        if not job.inline:
            return False
        events += len(job.events)
        if events > INLINE_GROUP_EVENTS:
            return False
        for event in job.events:
            if event.payload is not None:
                size += len(event.payload)
    return size <= INLINE_GROUP_BYTES


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
