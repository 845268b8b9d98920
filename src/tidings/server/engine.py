"""The event server's engine: processing sessions run through modules, then stored at once.

One :meth:`Engine.register` call is one session (Hat "Engine"). Every module is told
``on_session_start``; each new event of the session, the registered ones first, is offered in
order to every module whose subscription matches its type, module by module; the events a
module returns join the end of the same session's queue and are offered to all modules, the
one that added them included. When the queue is empty every module is told
``on_session_stop`` and the whole session is stored with one :meth:`EventStore.register`, so
its events share the session number and timestamp. Sessions run one at a time.

An event the store holds already (an outbox event published again, recognised by its outbox
id and type) is not offered to modules: it was processed when it was stored, and the store
keeps it once. With modules, the look-up, the sessions and their storing share one append
transaction (:meth:`EventStore.appending`), so no other writer can store such an event in
between and each outbox event is processed exactly once, as it is stored exactly once.

The core is synchronous: a module's ``process`` runs inside the session and must not call
:meth:`Engine.register` (it returns the events to add instead), nor write to the store
(whose append transaction it runs in); it may read it.

Modules are loaded by Python module path (:func:`load_module`): the module must define
``create(config: dict, engine: Engine) -> Module``. Hat passes the module's configuration
(whose ``module`` key is that path) and the engine; the module may keep the engine to start
sessions of its own later, outside ``process``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from tidings.errors import EngineError, ModuleLoadError, StoreError
from tidings.events.matching import QueryType, TypeMatcher
from tidings.events.model import EventType, NewEvent, PayloadKind, StoredEvent, json_event
from tidings.events.validation import validate_new_event
from tidings.server.store import EventStore
from tidings.server.store.appending import OutboxKey

log = logging.getLogger(__name__)

#: Type of the events the engine registers when it starts and stops (Hat).
ENGINE_EVENT_TYPE: EventType = ("event", "engine")
#: Payloads of the engine event: a JSON string, ``hat-event://events.yaml#/definitions/events/
#: engine`` (``enum: [STARTED, STOPPED]``).
STATUS_STARTED = "STARTED"
STATUS_STOPPED = "STOPPED"

#: A subscriber of stored sessions; gets the newly stored events of each session, in order.
Callback = Callable[[list[StoredEvent]], None]


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """An event of a running session, as modules see it before it is stored.

    ``session_id`` is the engine's session counter (the store numbers sessions itself when it
    stores them); ``instance`` is the 1-based place of the event in the session's queue.
    """

    session_id: int
    instance: int
    type: EventType
    payload: bytes | None
    payload_kind: PayloadKind | None
    source_timestamp_us: int | None
    outbox_event_id: str | None

    def to_new_event(self) -> NewEvent:
        return NewEvent(
            self.type,
            self.payload,
            self.payload_kind,
            self.source_timestamp_us,
            self.outbox_event_id,
        )


@runtime_checkable
class Module(Protocol):
    """An event server module (Hat); its calls run one at a time, inside sessions."""

    #: Query types (``?`` and a trailing ``*`` allowed) of the events offered to ``process``.
    subscription: tuple[QueryType, ...]

    def on_session_start(self, session_id: int) -> None: ...

    def process(self, session_id: int, event: SessionEvent) -> list[NewEvent]: ...

    def on_session_stop(self, session_id: int) -> None: ...


def load_module(path: str, config: dict[str, Any], engine: Engine) -> Module:
    """Import the Python module ``path`` and return ``create(config, engine)`` of it."""
    try:
        python_module = importlib.import_module(path)
    except (ImportError, ValueError, TypeError) as exc:
        raise ModuleLoadError(f"module {path!r}: cannot import it: {exc}") from exc
    create = getattr(python_module, "create", None)
    if not callable(create):
        raise ModuleLoadError(f"module {path!r}: has no create(config, engine) function")
    try:
        module = create(config, engine)
    except Exception as exc:
        raise ModuleLoadError(f"module {path!r}: create() failed: {exc!r}") from exc
    if not isinstance(module, Module):
        raise ModuleLoadError(
            f"module {path!r}: create() returned {type(module).__name__}, which lacks "
            "subscription, on_session_start, process or on_session_stop"
        )
    return module


def module_name(module: object) -> str:
    """How errors and logs name a module: its ``name`` attribute, else its class."""
    name = getattr(module, "name", None)
    return name if isinstance(name, str) and name else type(module).__qualname__


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
        self._modules = list(modules)
        self._matchers = [_matcher(module) for module in self._modules]
        self._max_added = max_session_events
        self._callbacks: list[Callback] = []
        self._lock = threading.RLock()
        self._in_session = False
        self._last_session_id = 0

    @property
    def store(self) -> EventStore:
        return self._store

    def load_modules(self, configs: Sequence[dict[str, Any]]) -> None:
        """Load the modules of ``engine.modules`` (each a dict with a ``module`` path), in order.

        They are created here rather than passed to the constructor because Hat hands every
        module the engine it runs in; they join after any modules given to the constructor.
        """
        for config in configs:
            module = load_module(config["module"], config, self)
            matcher = _matcher(module)
            self._modules.append(module)
            self._matchers.append(matcher)

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
        self, events: Sequence[NewEvent], *, strict: bool = False
    ) -> list[StoredEvent | None]:
        """Run one session of ``events``; return each one's stored event, None if invalid.

        An invalid event (bad type, payload, ...) fails alone: its slot is None and it is not
        offered to modules; with ``strict`` it aborts the session instead (for callers whose
        call is all or nothing). A module that raises, adds an invalid event, or makes the
        session add more than ``max_session_events`` events aborts it with
        :class:`EngineError`; nothing is stored then. An event already stored (see the
        module docstring) gets the stored one in its slot.
        """
        [result] = self.register_many([events], strict=strict)
        if isinstance(result, EngineError):
            raise result
        return result

    @property
    def has_modules(self) -> bool:
        return bool(self._modules)

    def register_many(
        self, requests: Sequence[Sequence[NewEvent]], *, wait: bool = True, strict: bool = False
    ) -> list[list[StoredEvent | None] | EngineError]:
        """Run one session per request, in order, and store them all in one transaction.

        This is the group commit of a busy server: each request is the session it would be
        alone (its own session number, timestamp and module calls); an aborted session gets
        its :class:`EngineError` in its slot and the others go on. A database failure fails
        them all (raised as :class:`StoreError`). ``wait`` is passed to
        :meth:`EventStore.register_sessions` (:class:`StoreBusy` if another writer holds the
        store; nothing was stored then). ``strict`` as for :meth:`register`.
        """
        with self._lock:
            if self._in_session:
                raise EngineError(
                    "register called during a session: a module adds events by returning "
                    "them from process"
                )
            self._in_session = True
            try:
                return self._run_many(requests, wait, strict)
            finally:
                self._in_session = False

    def _engine_event(self, status: str) -> StoredEvent:
        [stored] = self.register([json_event(ENGINE_EVENT_TYPE, status)])
        assert stored is not None
        return stored

    def _run_many(
        self, requests: Sequence[Sequence[NewEvent]], wait: bool, strict: bool
    ) -> list[list[StoredEvent | None] | EngineError]:
        planned: list[_Plan | EngineError] = []
        for events in requests:
            try:
                planned.append(self._plan(events, strict))
            except EngineError as exc:
                planned.append(exc)
        if self._modules and _queues(planned):
            with self._store.appending(wait=wait) as appending:
                self._process_all(planned, appending.stored_outbox_keys(_queued(planned)))
                registered = appending.register_sessions(_queues(planned), validated=True)
        else:
            registered = self._store.register_sessions(_queues(planned), validated=True, wait=wait)
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

    def _plan(self, events: Sequence[NewEvent], strict: bool) -> _Plan:
        """The session of ``events``: each input's place in the queue to store (None if
        refused) and that queue; with ``strict`` a refused event aborts it."""
        self._last_session_id += 1
        plan = _Plan(self._last_session_id, [], [])
        for index, new_event in enumerate(events):
            problem = validate_new_event(new_event)
            if problem is None:
                plan.slots.append(len(plan.queue))
                plan.queue.append(new_event)
            elif strict:
                raise EngineError(
                    f"session {plan.session_id}: event {index} refused: {problem}; "
                    "nothing was stored"
                )
            else:
                log.warning("session %d: event %d refused: %s", plan.session_id, index, problem)
                plan.slots.append(None)
        return plan

    def _process_all(self, planned: list[_Plan | EngineError], stored: set[OutboxKey]) -> None:
        """Run the planned sessions through the modules, in order, adding what they add; an
        aborted one's plan becomes its error. ``stored``: the outbox keys the store holds;
        their events, and repeats within the call, are not offered again."""
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
            try:
                self._process(plan.session_id, plan.queue, skip)
            except EngineError as exc:
                planned[number] = exc
                continue
            stored |= keys

    def _process(self, session_id: int, queue: list[NewEvent], skip: set[int]) -> None:
        """Run the session over ``queue`` (but the events at the indexes ``skip``),
        appending module additions to it."""
        started: list[Module] = []
        error: EngineError | None = None
        try:
            for module in self._modules:
                started.append(module)
                _call(module, "on_session_start", module.on_session_start, session_id)
            self._offer_all(session_id, queue, skip)
        except EngineError as exc:
            error = exc
        for module in started:
            try:
                _call(module, "on_session_stop", module.on_session_stop, session_id)
            except EngineError as exc:
                if error is None:
                    error = exc
                else:
                    log.error("session %d: %s", session_id, exc)
        if error is not None:
            raise error

    def _offer_all(self, session_id: int, queue: list[NewEvent], skip: set[int]) -> None:
        original = len(queue)
        position = 0
        while position < len(queue):
            new_event = queue[position]
            position += 1
            if position - 1 in skip:
                continue
            event = _session_event(session_id, position, new_event)
            for module, matcher in zip(self._modules, self._matchers, strict=True):
                if not matcher.matches(event.type):
                    continue
                added = _call(module, "process", module.process, session_id, event)
                if not added:
                    continue
                name = module_name(module)
                if not isinstance(added, list):
                    raise EngineError(
                        f"session {session_id}: module {name} returned "
                        f"{type(added).__name__} from process, not a list of NewEvent"
                    )
                for index, added_event in enumerate(added):
                    problem = validate_new_event(added_event)
                    if problem is not None:
                        raise EngineError(
                            f"session {session_id}: module {name} added an invalid event "
                            f"(#{index}): {problem}"
                        )
                queue.extend(added)
                if len(queue) - original > self._max_added:
                    raise EngineError(
                        f"session {session_id}: modules added more than "
                        f"{self._max_added} events (max_session_events), module {name} "
                        "last; a module loop? Nothing was stored"
                    )

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

    def outcome(self, stored: list[StoredEvent] | None) -> list[StoredEvent | None]:
        """Each input's stored event, given those of ``queue`` (None: nothing to store)."""
        if stored is None:
            return [None] * len(self.slots)
        return [None if slot is None else stored[slot] for slot in self.slots]


def _queued(planned: list[_Plan | EngineError]) -> list[NewEvent]:
    return [e for plan in planned if not isinstance(plan, EngineError) for e in plan.queue]


def _queues(planned: list[_Plan | EngineError]) -> list[list[NewEvent]]:
    """The queues to store, in order (a session with none stores nothing)."""
    return [plan.queue for plan in planned if not isinstance(plan, EngineError) and plan.queue]


def _matcher(module: Module) -> TypeMatcher:
    name = module_name(module)
    if not isinstance(module, Module):
        raise EngineError(
            f"module {name} lacks subscription, on_session_start, process or on_session_stop"
        )
    try:
        return TypeMatcher(module.subscription)
    except (StoreError, TypeError) as exc:
        raise EngineError(f"module {name}: invalid subscription: {exc}") from exc


def _call(module: Module, what: str, method: Callable[..., Any], *args: Any) -> Any:
    """Call a module method; any exception becomes an :class:`EngineError` naming it."""
    try:
        return method(*args)
    except Exception as exc:
        session_id = args[0]
        raise EngineError(
            f"session {session_id}: module {module_name(module)} failed in {what}: {exc!r}; "
            "the session is aborted, nothing was stored"
        ) from exc


def _session_event(session_id: int, instance: int, new_event: NewEvent) -> SessionEvent:
    return SessionEvent(
        session_id,
        instance,
        new_event.type,
        new_event.payload,
        new_event.payload_kind,
        new_event.source_timestamp_us,
        new_event.outbox_event_id,
    )
