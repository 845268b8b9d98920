"""hat-event 0.8.5's own modules, run unchanged by tidings' engine.

A hat module is an asynchronous resource (``hat.event.server.common.Module``): ``async
create(conf, engine, source)``, ``subscription`` (a hat ``Subscription``), ``async
on_session_start``/``on_session_stop(session_id)`` and ``async process(source, event)``
yielding ``RegisterEvent``s, with hat's own types throughout. tidings' engine is synchronous
and runs in the server's write thread (or a relay worker), so each hat module is wrapped in a
:class:`HatModule` with tidings' module interface, and all the hat modules of one engine live
on one asyncio loop of their own (:class:`HatLoop`), in a thread: a call from the session
runs there and the session waits for it, so the engine's one loop (rounds, sources, limits)
drives both kinds of module.

What a hat module sees is translated through the Hat wire's SBS shapes, which both sides
already speak (:mod:`tidings.wire.codec` and ``hat.event.common``), so payloads, types and
timestamps mean the same on both sides. The engine a hat module gets (:class:`HatEngine`)
has hat's ``register(source, events)``, ``query(data)``, ``register_events_cb`` and
``async_group``; ``register`` goes through :meth:`Engine.submit` (the server's write queue),
so a module's own later registrations are sessions like any other. As in hat, awaiting it
from inside ``process`` would wait for the session itself: a module must not.

The event a hat module sees during a session has the id and timestamp it is stored under,
as in hat-event: the engine numbers and stamps the session from the store's counters, in the
append transaction the session is stored in.

This module needs hat-event installed, as every hat module does itself; it is imported only
when ``engine.modules`` names a hat module.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from types import ModuleType
from typing import Any, TypeVar

from hat import aio
from hat.event.server import common as hat

from tidings.errors import EngineError, ModuleLoadError
from tidings.events.matching import QueryType, TypeMatcher
from tidings.events.model import EventType, NewEvent, StoredEvent
from tidings.events.query import QueryData
from tidings.events.sources import HAT_KINDS, Source, SourceKind
from tidings.server.engine import Engine
from tidings.server.module_interface import SessionEvent
from tidings.server.store.queries import query_events
from tidings.wire import codec

T = TypeVar("T")

#: tidings' source kinds as hat's ``SourceType`` names them.
_HAT_TYPES = {kind: hat.SourceType[kind.name] for kind in HAT_KINDS}


class HatLoop:
    """The asyncio loop, in a thread of its own, that one engine's hat modules live on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="tidings-hat-modules", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result (raised if it raises)."""
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise EngineError(
                "a hat module's engine was called from the modules' own loop and would wait "
                "for itself"
            )
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def is_hat_module(python_module: ModuleType) -> bool:
    """Whether ``python_module`` is written for hat-event: hat requires ``json_schema_id``
    and ``json_schema_repo`` of it (tidings' modules need neither), or its ``create`` is a
    coroutine function."""
    create = getattr(python_module, "create", None)
    return hasattr(python_module, "json_schema_repo") or asyncio.iscoroutinefunction(create)


def validate_conf(path: str, python_module: ModuleType, conf: dict[str, Any]) -> None:
    """Validate ``conf`` as hat's server does: by the module's ``json_schema_id`` in its
    ``json_schema_repo``, when it defines both."""
    repo = getattr(python_module, "json_schema_repo", None)
    schema_id = getattr(python_module, "json_schema_id", None)
    if not repo or not schema_id:
        return
    try:
        repo.validate(schema_id, conf)
    except Exception as exc:
        message = getattr(exc, "message", None) or str(exc)
        where = "/".join(str(p) for p in getattr(exc, "absolute_path", ()))
        at = f" at {where}" if where else ""
        raise ModuleLoadError(
            f"module {path!r}: configuration does not match its schema {schema_id}{at}: {message}"
        ) from exc


def to_hat_source(source: Source) -> Any:
    """hat's ``Source`` of ``source``; tidings' own kinds (the relay, the streams) appear as
    an Eventer with id 0, which no connection has."""
    hat_type = _HAT_TYPES.get(source.kind)
    if hat_type is None:
        return hat.Source(hat.SourceType.EVENTER, 0)
    return hat.Source(hat_type, source.id)


def from_hat_source(source: Any) -> Source:
    """tidings' ``Source`` of a hat ``Source`` (what a hat module registers on behalf of)."""
    try:
        return Source(SourceKind[source.type.name], int(source.id))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"not a hat-event Source: {source!r}") from exc


def to_hat_event(event: StoredEvent) -> Any:
    """hat's ``Event`` of a stored event."""
    return hat.event_from_sbs(_event_value(event.id, event.timestamp_us, event))


def session_to_hat_event(server_id: int, event: SessionEvent) -> Any:
    """hat's ``Event`` of an event of a running session, with the id and timestamp it is
    stored under."""
    event_id = hat.EventId(server_id, event.session_id, event.instance)
    return hat.event_from_sbs(_event_value(event_id, event.timestamp_us, event))


def _event_value(event_id: Any, timestamp_us: int, event: StoredEvent | SessionEvent) -> Any:
    source_ts = event.source_timestamp_us
    payload = (
        ("none", None)
        if event.payload is None or event.payload_kind is None
        else ("value", codec.payload_to_sbs(event.payload_kind, event.payload))
    )
    return {
        "id": {
            "server": event_id.server,
            "session": event_id.session,
            "instance": event_id.instance,
        },
        "type": list(event.type),
        "timestamp": codec.timestamp_to_sbs(timestamp_us),
        "sourceTimestamp": ("none", None)
        if source_ts is None
        else ("value", codec.timestamp_to_sbs(source_ts)),
        "payload": payload,
    }


def from_register_event(register_event: Any, field: str) -> NewEvent:
    """tidings' ``NewEvent`` of a hat ``RegisterEvent`` (checked as a client's would be)."""
    try:
        value = hat.register_event_to_sbs(register_event)
    except Exception as exc:
        raise EngineError(f"{field}: not a hat-event RegisterEvent: {register_event!r}") from exc
    return codec.register_event_from_sbs(value, field)


class HatEngine:
    """The engine a hat module is given: hat's ``Engine`` API over tidings' engine."""

    def __init__(self, engine: Engine, hat_loop: HatLoop) -> None:
        self._engine = engine
        self._loop = hat_loop.loop
        self._group = aio.Group(loop=self._loop)

    @property
    def async_group(self) -> Any:
        return self._group

    def register_events_cb(self, cb: Callable[[list[Any]], None]) -> Any:
        """Call ``cb`` (on the modules' loop) with the hat events of every stored session."""

        def registered(stored: list[StoredEvent]) -> None:
            events = [to_hat_event(e) for e in stored]
            self._loop.call_soon_threadsafe(cb, events)

        remove = self._engine.on_registered(registered)
        return _Handle(remove)

    async def register(self, source: Any, events: Sequence[Any]) -> list[Any]:
        """Register ``events`` as one session on behalf of ``source``; each one's hat event,
        None for an event refused."""
        if not events:
            return []
        new_events = [from_register_event(e, f"event {i}") for i, e in enumerate(events)]
        future = self._engine.submit(new_events, self._named(from_hat_source(source)))
        results = await asyncio.wrap_future(future)
        return [None if stored is None else to_hat_event(stored) for stored in results]

    def _named(self, source: Source) -> Source:
        """A module's source as the engine knows it (with its name)."""
        for known in self._engine.module_sources:
            if (known.kind, known.id) == (source.kind, source.id):
                return known
        return source

    async def query(self, data: Any) -> list[Any]:
        """hat's query, answered by the store."""
        query: QueryData = codec.query_from_sbs(hat.query_to_sbs(data))
        store = self._engine.store
        stored = await asyncio.get_running_loop().run_in_executor(None, query_events, store, query)
        return [to_hat_event(e) for e in stored]

    async def aclose(self) -> None:
        await self._group.async_close()


class _Handle:
    """hat's ``RegisterCallbackHandle``: ``cancel()`` removes the callback."""

    def __init__(self, remove: Callable[[], None]) -> None:
        self.cancel = remove

    def __enter__(self) -> _Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class HatModule:
    """One hat module behind tidings' (synchronous) module interface."""

    #: hat-event stores each session before it runs the next, so a hat module's query
    #: inside ``process`` finds every earlier session: the engine stores a group commit's
    #: sessions one by one (:meth:`Engine.register_many`).
    stores_each_session = True

    def __init__(
        self,
        name: str,
        module: Any,
        hat_loop: HatLoop,
        server_id: int,
        report_fault: Callable[[str], None],
    ) -> None:
        self.name = name
        self._module = module
        self._hat_loop = hat_loop
        self._server_id = server_id
        self._closing = False
        self._report_fault = report_fault
        try:
            TypeMatcher(self.subscription)
        except Exception as exc:
            self.close()
            raise ModuleLoadError(
                f"module {name!r}: its subscription is not a hat-event Subscription: {exc!r}"
            ) from exc
        asyncio.run_coroutine_threadsafe(self._watch(), hat_loop.loop)

    @property
    def subscription(self) -> tuple[QueryType, ...]:
        """The hat module's subscription now, as query types."""
        return tuple(tuple(t) for t in self._module.subscription.get_query_types())

    def matches(self, event_type: EventType) -> bool:
        """Whether the module is offered an event of ``event_type``: its ``subscription``
        read now, as hat-event's engine reads it for every event it offers (a module may
        change it as it goes), and matched by hat's own code."""
        try:
            return bool(self._module.subscription.matches(tuple(event_type)))
        except Exception as exc:
            raise EngineError(
                f"module {self.name}: its subscription cannot match {list(event_type)}: "
                f"{exc!r}; the session is aborted, nothing was stored"
            ) from exc

    def on_session_start(self, session_id: int) -> None:
        self._hat_loop.call(self._notify("on_session_start", session_id))

    def on_session_stop(self, session_id: int) -> None:
        self._hat_loop.call(self._notify("on_session_stop", session_id))

    def process(self, session_id: int, event: SessionEvent) -> list[NewEvent]:
        hat_event = session_to_hat_event(self._server_id, event)
        registered = self._hat_loop.call(self._collect(to_hat_source(event.source), hat_event))
        return [
            from_register_event(e, f"module {self.name}: event {i}")
            for i, e in enumerate(registered)
        ]

    async def _collect(self, source: Any, hat_event: Any) -> list[Any]:
        return [e async for e in self._module.process(source, hat_event)]

    def close(self) -> None:
        self._closing = True
        self._hat_loop.call(self._module.async_close())

    async def _watch(self) -> None:
        """A hat module that closes itself closes hat's engine, and its server stops: here
        the engine faults (:meth:`Engine.report_fault`), with the same end."""
        await self._module.wait_closing()
        if not self._closing:
            self._report_fault(f"hat module {self.name} closed itself")

    async def _notify(self, method: str, session_id: int) -> None:
        await getattr(self._module, method)(session_id)


async def create_hat_module(
    python_module: ModuleType, conf: dict[str, Any], engine: HatEngine, source: Source
) -> Any:
    """``create(conf, engine, source)`` of the hat module, on the modules' loop."""
    created = await aio.call(python_module.create, conf, engine, to_hat_source(source))
    for attribute in ("subscription", "process", "on_session_start", "on_session_stop"):
        if not hasattr(created, attribute):
            raise ModuleLoadError(
                f"module {conf['module']!r}: create() returned {type(created).__name__}, "
                f"which lacks {attribute}"
            )
    return created
