"""The event server's engine: processing sessions run through modules, then stored at once.

One :meth:`Engine.register` call is one session (Hat "Engine"), made on behalf of a
:class:`~tidings.events.sources.Source`. Every module is told ``on_session_start``; then the
session runs in rounds, as hat-event 0.8.5's engine does: the first round's events are the
registered ones; in each round, module by module (in ``engine.modules`` order), every event
of the round that matches the module's subscription is offered to it, in order, with its
source; what the modules add (carrying the adding module's source) is appended to the
session and makes the next round, offered to every module, the one that added it included.
When a round adds nothing every module is told ``on_session_stop`` and the whole session is
stored with one :meth:`EventStore.register`, with each event's source, so its events share
the session number and timestamp. Sessions run one at a time.

An event the store holds already (an outbox event published again, recognised by its outbox
id and type) is not offered to modules: it was processed when it was stored, and the store
keeps it once. With modules, the look-up, the sessions and their storing share one append
transaction (:meth:`EventStore.appending`), so no other writer can store such an event in
between and each outbox event is processed exactly once, as it is stored exactly once.

The core is synchronous: a module's ``process`` runs inside the session and must not call
:meth:`Engine.register` (it returns the events to add instead), nor write to the store
(whose append transaction it runs in); it may read it. A module registers events of its own
later, outside ``process``, with :meth:`Engine.submit`. hat-event's asynchronous modules
run through an adapter with this same interface (:mod:`tidings.server.hat_modules`); the
modules of ``engine.modules`` are loaded by :mod:`tidings.server.modules`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from tidings.errors import EngineError, StoreError
from tidings.events.model import EventType, NewEvent, StoredEvent, json_event
from tidings.events.sources import ENGINE_SOURCE, Source, module_source
from tidings.events.validation import validate_new_event
from tidings.server.module_interface import (
    Matcher,
    Module,
    SessionEvent,
    call_module,
    check_added,
    module_matcher,
    module_name,
    session_event,
)
from tidings.server.store import EventStore
from tidings.server.store.appending import OutboxKey

__all__ = [
    "ENGINE_EVENT_TYPE",
    "STATUS_STARTED",
    "STATUS_STOPPED",
    "Callback",
    "Engine",
    "Module",
    "SessionEvent",
    "Submitter",
    "module_name",
]

log = logging.getLogger(__name__)

#: Type of the events the engine registers when it starts and stops (Hat).
ENGINE_EVENT_TYPE: EventType = ("event", "engine")
#: Payloads of the engine event: a JSON string, ``hat-event://events.yaml#/definitions/events/
#: engine`` (``enum: [STARTED, STOPPED]``).
STATUS_STARTED = "STARTED"
STATUS_STOPPED = "STOPPED"

#: A subscriber of stored sessions; gets the newly stored events of each session, in order.
Callback = Callable[[list[StoredEvent]], None]
#: Registers a session from any thread, outside the sessions (see :meth:`Engine.submit`).
Submitter = Callable[[Sequence[NewEvent], Source], "Future[list[StoredEvent | None]]"]


class Engine:
    """Runs processing sessions through ``modules`` and stores each in ``store``."""

    def __init__(
        self,
        store: EventStore,
        modules: Sequence[Module],
        max_session_events: int = 10_000,
    ) -> None:
        if isinstance(max_session_events, bool) or not isinstance(max_session_events, int):
            raise EngineError(f"max_session_events must be an int, not {max_session_events!r}")
        if max_session_events < 1:
            raise EngineError(f"max_session_events must be positive, not {max_session_events}")
        self._store = store
        self._modules: list[Module] = []
        self._matchers: list[Matcher] = []
        self._sources: list[Source] = []
        #: Some module queries the store inside ``process`` and must find every earlier
        #: session there (hat modules): a group's sessions are stored one by one.
        self._each_stored = False
        self._max_added = max_session_events
        self._callbacks: list[Callback] = []
        self._closers: list[Callable[[], None]] = []
        self._lock = threading.RLock()
        self._in_session = False
        self._last_session_id = 0
        self._submitter: Submitter | None = None
        self._own_submitter: ThreadPoolExecutor | None = None
        #: Why the engine can run no more sessions (a module closed itself), or None.
        self.fault: str | None = None
        self._fault_callbacks: list[Callable[[str], None]] = []
        for module in modules:
            self.add_module(module)

    @property
    def store(self) -> EventStore:
        return self._store

    @property
    def module_count(self) -> int:
        """How many modules run; the next one added is numbered so (its source id)."""
        return len(self._modules)

    @property
    def module_sources(self) -> list[Source]:
        """The sources of the modules, in their order."""
        return list(self._sources)

    def add_module(self, module: Module, source: Source | None = None) -> None:
        """Run ``module`` in every session from now on, after the modules added before it;
        the events it adds carry ``source`` (by default a module source numbered by its
        place, as hat-event numbers the modules of ``engine.modules``)."""
        matcher = module_matcher(module)
        if source is None:
            source = module_source(len(self._modules), module_name(module))
        self._modules.append(module)
        self._matchers.append(matcher)
        self._sources.append(source)
        self._each_stored = self._each_stored or bool(getattr(module, "stores_each_session", False))

    def on_fault(self, callback: Callable[[str], None]) -> None:
        """Call ``callback`` (from any thread) with the reason once the engine faults."""
        self._fault_callbacks.append(callback)
        if self.fault is not None:
            callback(self.fault)

    def report_fault(self, reason: str) -> None:
        """A module cannot run any more (a hat module closed itself): every session fails
        from now on, and the server stops, as hat-event's engine closes then."""
        if self.fault is not None:
            return
        self.fault = reason
        log.error("engine: %s; no session can run any more", reason)
        for callback in list(self._fault_callbacks):
            try:
                callback(reason)
            except Exception:
                log.exception("engine fault callback %r failed", callback)

    def on_close(self, closer: Callable[[], None]) -> None:
        """Call ``closer`` in :meth:`close`, after the modules' own ``close``."""
        self._closers.append(closer)

    def close(self) -> None:
        """Close the modules that hold resources (their ``close()``), last added first, then
        what :meth:`on_close` asked for; the store stays open (it is the caller's)."""
        for module in reversed(self._modules):
            close = getattr(module, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    log.exception("module %s: close failed", module_name(module))
        self._modules, self._matchers, self._sources = [], [], []
        self._each_stored = False
        closers, self._closers = self._closers, []
        for closer in reversed(closers):
            try:
                closer()
            except Exception:
                log.exception("engine: closing %r failed", closer)
        if self._own_submitter is not None:
            self._own_submitter.shutdown(wait=True)
            self._own_submitter = None

    def set_submitter(self, submitter: Submitter | None) -> None:
        """Route :meth:`submit` through ``submitter`` (the server's write queue, which keeps
        its order, durability and listeners); None: back to a thread of the engine's own."""
        self._submitter = submitter

    def submit(
        self, events: Sequence[NewEvent], source: Source
    ) -> Future[list[StoredEvent | None]]:
        """Register a session of ``events`` from any thread, outside the sessions; returns a
        future of its result. This is how a module registers events of its own later
        (hat-event's ``engine.register(source, events)``), never from inside ``process``:
        the session running ``process`` would wait for itself."""
        if self._submitter is not None:
            return self._submitter(events, source)
        if self._own_submitter is None:
            self._own_submitter = ThreadPoolExecutor(1, thread_name_prefix="tidings-engine")
        return self._own_submitter.submit(self.register, events, source=source)

    def on_registered(self, callback: Callback) -> Callable[[], None]:
        """Call ``callback`` with the new events of every stored session; returns a remover.

        A raising callback is logged and does not affect the session or other callbacks.
        """
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    def start(self) -> StoredEvent:
        """Register the engine event with status ``STARTED``."""
        return self._engine_event(STATUS_STARTED)

    def stop(self) -> StoredEvent:
        """Register the engine event with status ``STOPPED``."""
        return self._engine_event(STATUS_STOPPED)

    def register(
        self,
        events: Sequence[NewEvent],
        *,
        strict: bool = False,
        source: Source = ENGINE_SOURCE,
    ) -> list[StoredEvent | None]:
        """Run one session of ``events`` registered by ``source``; return each one's stored
        event, None if invalid.

        An invalid event (bad type, payload, ...) fails alone: its slot is None and it is not
        offered to modules; with ``strict`` it aborts the session instead (for callers whose
        call is all or nothing). A module that raises, adds an invalid event, or makes the
        session add more than ``max_session_events`` events aborts it with
        :class:`EngineError`; nothing is stored then. An event already stored (see the
        module docstring) gets the stored one in its slot.
        """
        [result] = self.register_many([events], strict=strict, sources=[source])
        if isinstance(result, EngineError):
            raise result
        return result

    @property
    def has_modules(self) -> bool:
        return bool(self._modules)

    def register_many(
        self,
        requests: Sequence[Sequence[NewEvent]],
        *,
        wait: bool = True,
        strict: bool = False,
        sources: Sequence[Source] | None = None,
    ) -> list[list[StoredEvent | None] | EngineError]:
        """Run one session per request, in order, and store them all in one transaction;
        or each in its own, one after the other, when a module says ``stores_each_session``
        (a hat module: its queries inside ``process`` find every earlier session, as in
        hat-event, which stores each session before it runs the next).

        This is the group commit of a busy server: each request is the session it would be
        alone (its own session number, timestamp and module calls); an aborted session gets
        its :class:`EngineError` in its slot and the others go on. A database failure fails
        them all (raised as :class:`StoreError`). ``wait`` is passed to
        :meth:`EventStore.register_sessions` (:class:`StoreBusy` if another writer holds the
        store; nothing was stored then). ``strict`` as for :meth:`register`. ``sources``:
        each request's source (default: the engine's).
        """
        if sources is None:
            sources = [ENGINE_SOURCE] * len(requests)
        elif len(sources) != len(requests):
            raise EngineError(f"{len(requests)} requests but {len(sources)} sources")
        if self.fault is not None:
            raise EngineError(f"{self.fault}; the engine runs no more sessions")
        with self._lock:
            if self._in_session:
                raise EngineError(
                    "register called during a session: a module adds events by returning "
                    "them from process"
                )
            self._in_session = True
            try:
                return self._run_many(requests, sources, wait, strict)
            finally:
                self._in_session = False

    def _engine_event(self, status: str) -> StoredEvent:
        event = json_event(ENGINE_EVENT_TYPE, status)
        if self.fault is not None:  # no module can run: stored as hat's engine does then
            [registered] = self._store.register_sessions([[event]], sources=[[ENGINE_SOURCE]])
            self._notify(registered.fresh)
            return registered.events[0]
        [stored] = self.register([event])
        assert stored is not None
        return stored

    def _run_many(
        self,
        requests: Sequence[Sequence[NewEvent]],
        sources: Sequence[Source],
        wait: bool,
        strict: bool,
    ) -> list[list[StoredEvent | None] | EngineError]:
        if len(requests) > 1 and self._each_stored:
            return self._run_each(requests, sources, wait, strict)
        planned: list[_Plan | EngineError] = []
        for events, source in zip(requests, sources, strict=True):
            try:
                planned.append(self._plan(events, source, strict))
            except EngineError as exc:
                planned.append(exc)
        if self._modules and _queues(planned):
            with self._store.appending(wait=wait) as appending:
                self._process_all(
                    planned,
                    appending.stored_outbox_keys(_queued(planned)),
                    appending.last_numbers(),
                )
                registered = appending.register_sessions(
                    _queues(planned),
                    validated=True,
                    sources=_sources(planned),
                    timestamps=_timestamps(planned),
                )
        else:
            registered = self._store.register_sessions(
                _queues(planned), validated=True, wait=wait, sources=_sources(planned)
            )
        sessions = iter(registered)
        results: list[list[StoredEvent | None] | EngineError] = []
        for plan in planned:
            if isinstance(plan, EngineError) or not plan.queue:
                results.append(plan if isinstance(plan, EngineError) else plan.outcome(None))
                continue
            session = next(sessions)
            self._notify(session.fresh)
            results.append(plan.outcome(session.events))
        return results

    def _run_each(
        self,
        requests: Sequence[Sequence[NewEvent]],
        sources: Sequence[Source],
        wait: bool,
        strict: bool,
    ) -> list[list[StoredEvent | None] | EngineError]:
        """The sessions of ``requests`` each stored in its own transaction, in order. A
        failure of the first is raised (nothing was stored); once one is stored, a failure
        fails that session and those after it in their slots, not the stored ones."""
        results: list[list[StoredEvent | None] | EngineError] = []
        for events, source in zip(requests, sources, strict=True):
            try:
                results += self._run_many([events], [source], wait, strict)
            except StoreError as exc:
                if not results:
                    raise
                failed = EngineError(f"session not stored: {exc}")
                results += [failed] * (len(requests) - len(results))
                break
        return results

    def _plan(self, events: Sequence[NewEvent], source: Source, strict: bool) -> _Plan:
        """The session of ``events`` registered by ``source``: each input's place in the
        queue to store (None if refused) and that queue; with ``strict`` a refused event
        aborts it."""
        self._last_session_id += 1
        plan = _Plan(self._last_session_id, [], [], [])
        for index, new_event in enumerate(events):
            problem = validate_new_event(new_event)
            if problem is None:
                plan.slots.append(len(plan.queue))
                plan.queue.append(new_event)
                plan.sources.append(source)
            elif strict:
                raise EngineError(
                    f"session {plan.session_id}: event {index} refused: {problem}; "
                    "nothing was stored"
                )
            else:
                log.warning("session %d: event %d refused: %s", plan.session_id, index, problem)
                plan.slots.append(None)
        return plan

    def _process_all(
        self,
        planned: list[_Plan | EngineError],
        stored: set[OutboxKey],
        last: tuple[int, int],
    ) -> None:
        """Run the planned sessions through the modules, in order, adding what they add; an
        aborted one's plan becomes its error. ``stored``: the outbox keys the store holds;
        their events, and repeats within the call, are not offered again. ``last``: the
        store's last session and instance numbers of this server, from which each session
        that will be stored is numbered, as the store will number it."""
        session, instance = last
        for number, plan in enumerate(planned):
            if isinstance(plan, EngineError) or not plan.queue:
                continue
            skip: set[int] = set()
            keys: set[OutboxKey] = set()
            for index, new_event in enumerate(plan.queue):
                if new_event.outbox_event_id is not None:
                    key = (new_event.outbox_event_id, new_event.type)
                    if key in stored or key in keys:
                        skip.add(index)
                    keys.add(key)
            if len(skip) == len(plan.queue):
                continue
            plan.session_id = session + 1
            plan.timestamp_us = time.time_ns() // 1000
            plan.instances = _instances(len(plan.queue), skip, instance)
            plan.last_instance = instance + len(plan.queue) - len(skip)
            try:
                self._process(plan, skip)
            except EngineError as exc:
                planned[number] = exc
                continue
            stored |= keys
            session, instance = plan.session_id, plan.last_instance

    def _process(self, plan: _Plan, skip: set[int]) -> None:
        """Run the session of ``plan`` (but its events at the indexes ``skip``), appending
        module additions to its queue."""
        session_id = plan.session_id
        started: list[Module] = []
        error: EngineError | None = None
        try:
            for module in self._modules:
                started.append(module)
                call_module(module, "on_session_start", module.on_session_start, session_id)
            self._rounds(plan, skip)
        except EngineError as exc:
            error = exc
        for module in started:
            try:
                call_module(module, "on_session_stop", module.on_session_stop, session_id)
            except EngineError as exc:
                if error is None:
                    error = exc
                else:
                    log.error("session %d: %s", session_id, exc)
        if error is not None:
            raise error

    def _rounds(self, plan: _Plan, skip: set[int]) -> None:
        """hat-event 0.8.5's processing: round after round, module by module, each event of
        the round offered in order; what a round adds is the next round."""
        session_id, queue = plan.session_id, plan.queue
        original = len(queue)
        round_ = [index for index in range(original) if index not in skip]
        while round_:
            added_indexes: list[int] = []
            for module, matcher, source in zip(
                self._modules, self._matchers, self._sources, strict=True
            ):
                for index in round_:
                    new_event = queue[index]
                    if not matcher.matches(new_event.type):
                        continue
                    event = session_event(
                        session_id,
                        plan.instances[index],
                        new_event,
                        plan.sources[index],
                        plan.timestamp_us,
                    )
                    added = call_module(module, "process", module.process, session_id, event)
                    if not added:
                        continue
                    check_added(session_id, module, added)
                    added_indexes.extend(range(len(queue), len(queue) + len(added)))
                    queue.extend(added)
                    plan.sources.extend([source] * len(added))
                    after = plan.last_instance
                    plan.instances.extend(range(after + 1, after + 1 + len(added)))
                    plan.last_instance = after + len(added)
                    if len(queue) - original > self._max_added:
                        raise EngineError(
                            f"session {session_id}: modules added more than "
                            f"{self._max_added} events (max_session_events), module "
                            f"{module_name(module)} last; a module loop? Nothing was stored"
                        )
            round_ = added_indexes

    def _notify(self, stored: list[StoredEvent]) -> None:
        if not stored:
            return
        for callback in list(self._callbacks):
            try:
                callback(stored)
            except Exception:
                log.exception("registered-events callback %r failed", callback)


@dataclass(slots=True)
class _Plan:
    """One session of a register call, validated: its queue grows by what modules add."""

    session_id: int
    #: Per input, its index in ``queue``, or None if it was refused.
    slots: list[int | None]
    queue: list[NewEvent]
    #: Per event of ``queue``, who registered it.
    sources: list[Source]
    #: With modules: the session's timestamp, and per event of ``queue`` the instance it is
    #: stored under (0: it is not, being stored already), as the store will number them.
    timestamp_us: int = 0
    instances: list[int] = field(default_factory=list)
    last_instance: int = 0

    def outcome(self, stored: list[StoredEvent] | None) -> list[StoredEvent | None]:
        """Each input's stored event, given those of ``queue`` (None: nothing to store)."""
        if stored is None:
            return [None] * len(self.slots)
        return [None if slot is None else stored[slot] for slot in self.slots]


def _instances(count: int, skip: set[int], last: int) -> list[int]:
    """The instances of a session's ``count`` events after ``last``, but those at ``skip``
    (0: not stored)."""
    instances: list[int] = []
    for index in range(count):
        if index in skip:
            instances.append(0)
        else:
            last += 1
            instances.append(last)
    return instances


def _timestamps(planned: list[_Plan | EngineError]) -> list[int | None]:
    """The timestamps the modules were shown, per session of :func:`_queues` (None: one
    that ran no modules, its events all stored already)."""
    return [
        plan.timestamp_us or None
        for plan in planned
        if not isinstance(plan, EngineError) and plan.queue
    ]


def _queued(planned: list[_Plan | EngineError]) -> list[NewEvent]:
    return [e for plan in planned if not isinstance(plan, EngineError) for e in plan.queue]


def _queues(planned: list[_Plan | EngineError]) -> list[list[NewEvent]]:
    """The queues to store, in order (a session with none stores nothing)."""
    return [plan.queue for plan in planned if not isinstance(plan, EngineError) and plan.queue]


def _sources(planned: list[_Plan | EngineError]) -> list[list[Source]]:
    """The sources of :func:`_queues`' events, per session and event."""
    return [plan.sources for plan in planned if not isinstance(plan, EngineError) and plan.queue]
