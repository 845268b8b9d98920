"""The event server's engine: processing sessions run through modules, then stored at once.

One :meth:`Engine.register` call is one session (Hat "Engine"). Every module is told
``on_session_start``; each new event of the session, the registered ones first, is offered in
order to every module whose subscription matches its type, module by module; the events a
module returns join the end of the same session's queue and are offered to all modules, the
one that added them included. When the queue is empty every module is told
``on_session_stop`` and the whole session is stored with one :meth:`EventStore.register`, so
its events share the session number and timestamp. Sessions run one at a time.

The core is synchronous: a module's ``process`` runs inside the session and must not call
:meth:`Engine.register` (it returns the events to add instead).

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

    def register(self, events: Sequence[NewEvent]) -> list[StoredEvent | None]:
        """Run one session of ``events``; return each one's stored event, None if invalid.

        An invalid event (bad type, payload, ...) fails alone: its slot is None and it is not
        offered to modules. A module that raises, adds an invalid event, or makes the
        session add more than ``max_session_events`` events aborts it with
        :class:`EngineError`; nothing is stored then.
        """
        [result] = self.register_many([events])
        if isinstance(result, EngineError):
            raise result
        return result

    @property
    def has_modules(self) -> bool:
        return bool(self._modules)

    def register_many(
        self, requests: Sequence[Sequence[NewEvent]], *, wait: bool = True
    ) -> list[list[StoredEvent | None] | EngineError]:
        """Run one session per request, in order, and store them all in one transaction.

        This is the group commit of a busy server: each request is the session it would be
        alone (its own session number, timestamp and module calls); an aborted session gets
        its :class:`EngineError` in its slot and the others go on. A database failure fails
        them all (raised as :class:`StoreError`). ``wait`` is passed to
        :meth:`EventStore.register_sessions` (:class:`StoreBusy` if another writer holds the
        store; the sessions have then run through the modules but nothing was stored).
        """
        with self._lock:
            if self._in_session:
                raise EngineError(
                    "register called during a session: a module adds events by returning "
                    "them from process"
                )
            self._in_session = True
            try:
                return self._run_many(requests, wait)
            finally:
                self._in_session = False

    def _engine_event(self, status: str) -> StoredEvent:
        [stored] = self.register([json_event(ENGINE_EVENT_TYPE, status)])
        assert stored is not None
        return stored

    def _run_many(
        self, requests: Sequence[Sequence[NewEvent]], wait: bool
    ) -> list[list[StoredEvent | None] | EngineError]:
        planned: list[tuple[list[int | None], list[NewEvent]] | EngineError] = []
        for events in requests:
            try:
                planned.append(self._session(events))
            except EngineError as exc:
                planned.append(exc)
        queues = [plan[1] for plan in planned if not isinstance(plan, EngineError) and plan[1]]
        registered = iter(
            self._store.register_sessions(queues, validated=True, wait=wait) if queues else []
        )
        results: list[list[StoredEvent | None] | EngineError] = []
        for plan in planned:
            if isinstance(plan, EngineError):
                results.append(plan)
                continue
            slots, queue = plan
            if not queue:
                results.append([None] * len(slots))
                continue
            session = next(registered)
            self._notify(session.fresh)
            results.append([None if slot is None else session.events[slot] for slot in slots])
        return results

    def _session(self, events: Sequence[NewEvent]) -> tuple[list[int | None], list[NewEvent]]:
        """Run one processing session; return each input's place in the queue to store
        (None if refused) and that queue, module additions included."""
        self._last_session_id += 1
        session_id = self._last_session_id
        queue: list[NewEvent] = []
        slots: list[int | None] = []
        for index, new_event in enumerate(events):
            problem = validate_new_event(new_event)
            if problem is None:
                slots.append(len(queue))
                queue.append(new_event)
            else:
                log.warning("session %d: event %d refused: %s", session_id, index, problem)
                slots.append(None)
        if queue and self._modules:
            self._process(session_id, queue)
        return slots, queue

    def _process(self, session_id: int, queue: list[NewEvent]) -> None:
        """Run the session over ``queue``, appending module additions to it."""
        started: list[Module] = []
        error: EngineError | None = None
        try:
            for module in self._modules:
                started.append(module)
                _call(module, "on_session_start", module.on_session_start, session_id)
            self._offer_all(session_id, queue)
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

    def _offer_all(self, session_id: int, queue: list[NewEvent]) -> None:
        original = len(queue)
        position = 0
        while position < len(queue):
            new_event = queue[position]
            position += 1
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
