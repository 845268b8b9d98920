"""What an engine module is, as the engine sees it: the events it is offered, its interface,
and the checked calls into it.

The engine (:mod:`tidings.server.engine`) runs sessions through objects with this interface:
tidings' own synchronous modules, and hat-event's asynchronous ones behind the adapter of
:mod:`tidings.server.hat_modules`. A module's failure becomes an :class:`EngineError` naming
it, which aborts the session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from tidings.errors import EngineError, StoreError
from tidings.events.matching import QueryType, TypeMatcher
from tidings.events.model import EventType, NewEvent, PayloadKind
from tidings.events.sources import ENGINE_SOURCE, Source
from tidings.events.validation import validate_new_event


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """An event of a running session, as modules see it before it is stored.

    ``session_id`` and ``instance`` are the id the event is stored under, and
    ``timestamp_us`` the session's timestamp, as in hat-event (the engine takes them from
    the store's counters in the append transaction the session runs in; an event a module
    adds with an outbox id the store holds already is not stored, and the events after it
    in its session then get one number less than they were shown). ``source`` is who
    registered it (a module's additions carry that module's source).
    """

    session_id: int
    instance: int
    type: EventType
    payload: bytes | None
    payload_kind: PayloadKind | None
    source_timestamp_us: int | None
    outbox_event_id: str | None
    source: Source = ENGINE_SOURCE
    timestamp_us: int = 0

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
    """An event server module (Hat); its calls run one at a time, inside sessions.

    A module that holds resources may also define ``close()``: :meth:`Engine.close` calls
    it once, after the last session.
    """

    @property
    def subscription(self) -> tuple[QueryType, ...]:
        """Query types (``?`` and a trailing ``*`` allowed) of the events offered to
        ``process`` (a plain attribute will do)."""

    def on_session_start(self, session_id: int) -> None: ...

    def process(self, session_id: int, event: SessionEvent) -> list[NewEvent]: ...

    def on_session_stop(self, session_id: int) -> None: ...


def module_name(module: object) -> str:
    """How errors and logs name a module: its ``name`` attribute, else its class."""
    name = getattr(module, "name", None)
    return name if isinstance(name, str) and name else type(module).__qualname__


def check_added(session_id: int, module: Module, added: object) -> None:
    """Refuse what ``process`` returned unless it is a list of valid new events."""
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
                f"session {session_id}: module {name} added an invalid event (#{index}): {problem}"
            )


class Matcher(Protocol):
    """Tells whether an event of a type is offered to a module."""

    def matches(self, event_type: EventType) -> bool: ...


def module_matcher(module: Module) -> Matcher:
    """What decides which events ``module`` is offered: its ``subscription``, read once; or,
    if it has one, its own ``matches(event_type)``, asked for every event offered, for a
    module whose subscription changes as it goes (hat-event reads a module's subscription
    for every event, :class:`~tidings.server.hat_modules.HatModule`)."""
    name = module_name(module)
    if not isinstance(module, Module):
        raise EngineError(
            f"module {name} lacks subscription, on_session_start, process or on_session_stop"
        )
    if callable(getattr(module, "matches", None)):
        return cast(Matcher, module)
    try:
        return TypeMatcher(module.subscription)
    except (StoreError, TypeError) as exc:
        raise EngineError(f"module {name}: invalid subscription: {exc}") from exc


def call_module(module: Module, what: str, method: Callable[..., Any], *args: Any) -> Any:
    """Call a module method; any exception becomes an :class:`EngineError` naming it."""
    try:
        return method(*args)
    except Exception as exc:
        session_id = args[0]
        raise EngineError(
            f"session {session_id}: module {module_name(module)} failed in {what}: {exc!r}; "
            "the session is aborted, nothing was stored"
        ) from exc


def session_event(
    session_id: int, instance: int, new_event: NewEvent, source: Source, timestamp_us: int
) -> SessionEvent:
    return SessionEvent(
        session_id,
        instance,
        new_event.type,
        new_event.payload,
        new_event.payload_kind,
        new_event.source_timestamp_us,
        new_event.outbox_event_id,
        source,
        timestamp_us,
    )
