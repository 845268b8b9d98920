"""hat-event 0.8.5's modules run unchanged in tidings, and give what they give in hat.

The modules of ``tests.support.hat_modules`` are written for hat-event only; the same files,
with the same ``engine.modules``, run in a real hat-event 0.8.5 server (its own process, lmdb
backend) and in tidings. hat-event's own client registers the same sessions on both and
reads everything back: the sessions (grouped by their event ids) must hold the same events,
in the same order, with the same types and payloads. The modules' payloads say on whose
behalf each event they answer was registered (its Source) and which module answered, so the
sources are compared too.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import hat.event.common as hat
import hat.event.eventer as hat_eventer
import pytest

from bench.harness.processes import free_port, local_address, wait_for_port
from tests.support.helpers import hat_event_server
from tests.support.waiting import run
from tidings.config.server import ServerConfig, load_server_config
from tidings.errors import EngineError, ModuleLoadError
from tidings.events.sources import Source, SourceKind
from tidings.server.runner import RunningServer, serve
from tidings.server.store import EventStore

pytestmark = pytest.mark.sockets

MODULES: list[dict[str, Any]] = [
    {
        "module": "tests.support.hat_modules.react",
        "subscriptions": [["a", "*"]],
        "prefix": ["ra"],
    },
    {
        "module": "tests.support.hat_modules.react",
        "subscriptions": [["ra", "*"], ["x", "*"]],
        "prefix": ["rb"],
    },
    {
        "module": "tests.support.hat_modules.sessions",
        "subscriptions": [["a", "*"], ["x", "*"], ["ra", "*"], ["rb", "*"], ["later", "*"]],
    },
    {"module": "tests.support.hat_modules.later"},
]


LATER = "tests.support.hat_modules.later"


def _json(value: Any) -> hat.EventPayload:
    return hat.EventPayload(hat.EventPayloadType.JSON, value)


#: The sessions hat-event's client registers, one register call each.
SESSIONS: list[list[hat.RegisterEvent]] = [
    [
        hat.RegisterEvent(("a", "1"), hat.Timestamp(100, 5), _json({"v": 1})),
        hat.RegisterEvent(("x", "1"), None, _json([1, 2])),
        hat.RegisterEvent(("a", "2"), None, None),
    ],
    [
        hat.RegisterEvent(("a", "3"), None, hat.EventPayload(hat.EventPayloadType.BINARY, b"\0")),
        hat.RegisterEvent(("other",), None, _json("not for the modules")),
    ],
    [
        hat.RegisterEvent(
            ("x", "sbs"),
            None,
            hat.EventPayload(hat.EventPayloadType.SBS, hat.SbsData(None, "T", b"\x01")),
        ),
    ],
    [hat.RegisterEvent(("later", "1"), None, _json("soon"))],
]

#: A session as compared: each event's type, source timestamp and payload, in id order.
Session = list[tuple[tuple[str, ...], Any, Any]]


async def _exercise(
    address: str, registered: list[list[hat.RegisterEvent]] = SESSIONS
) -> list[Session]:
    """Register :data:`SESSIONS` through hat's client, wait for the later module's own two
    sessions, and return every session the server holds (its own start and the client's
    CONNECTED event included)."""
    client = await hat_eventer.connect(address)
    try:
        for events in registered:
            results = await client.register_with_response(events)
            assert all(result is not None for result in results)

        found: list[hat.Event] = []
        for _ in range(300):  # up to 15 s for the later module's own sessions
            found = list(await client.query(hat.QueryData()))
            if any(e.event_type == ("later-found", "1") for e in found):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"{address}: the later module registered nothing: {found}")
    finally:
        await client.async_close()
    sessions: dict[int, list[hat.Event]] = {}
    for event in sorted(found, key=lambda e: (e.event_id.session, e.event_id.instance)):
        sessions.setdefault(event.event_id.session, []).append(event)
    return [
        [(e.event_type, e.source_timestamp, e.payload) for e in session]
        for session in sessions.values()
    ]


def _config(tmp_path: Path, port: int, modules: list[dict[str, Any]]) -> ServerConfig:
    return load_server_config(
        {
            "type": "event",
            "backend": {"module": "tidings.server.backends.sqlite", "db_path": "events.db"},
            "engine": {"server_id": 1, "modules": modules},
            "eventer_server": {"address": local_address(port)},
        },
        tmp_path,
    )


def _eventer(sessions: list[Session]) -> list[Session]:
    return [s for s in sessions if s[0][0] == ("event", "eventer")]


def _without_eventer(sessions: list[Session]) -> list[Session]:
    return [s for s in sessions if s[0][0] != ("event", "eventer")]


@contextlib.asynccontextmanager
async def _tidings(
    tmp_path: Path, modules: list[dict[str, Any]]
) -> AsyncIterator[tuple[str, RunningServer]]:
    port = free_port()
    server = await RunningServer.start(_config(tmp_path, port, modules))
    try:
        # The harness checks that hat's server listens with a connection of its own (its
        # CONNECTED and DISCONNECTED events, Eventer id 1): the same here.
        await asyncio.to_thread(wait_for_port, port, 5)
        for _ in range(100):
            if server.store.count() >= 3:  # STARTED, CONNECTED, DISCONNECTED
                break
            await asyncio.sleep(0.05)
        yield local_address(port), server
    finally:
        await server.aclose()


def test_hat_modules_register_the_same_events_on_tidings_as_on_hat_event(
    tmp_path: Path,
) -> None:
    async def on_tidings() -> tuple[list[Session], dict[tuple[str, ...], Source]]:
        async with _tidings(tmp_path, MODULES) as (address, server):
            sessions = await _exercise(address)
            stored = server.store.read(0, 1000)
            sources = server.store.sources_of([e.id for e in stored])
        return sessions, {e.type: sources[e.id] for e in stored}

    with hat_event_server(tmp_path, 1, modules=MODULES, syncer=False) as (port, _, _process):
        on_hat = run(_exercise(local_address(port)), 60)
    ours, sources = run(on_tidings(), 60)

    # The Eventer's CONNECTED and DISCONNECTED sessions race with the client's first
    # register on either server (the harness's probe connection closes as the client
    # connects): compared apart, as a whole.
    assert _without_eventer(ours) == _without_eventer(on_hat)
    assert sorted(map(repr, _eventer(ours))) == sorted(map(repr, _eventer(on_hat)))
    # What the comparison covers: the modules answered, in rounds, from every source.
    types = [event_type for session in ours for event_type, _, _ in session]
    assert ("event", "engine") in types and ("event", "eventer") in types
    for expected in [("ra", "1"), ("rb", "1"), ("rb", "sbs"), ("counted", "ra", "1")]:
        assert expected in types
    assert ("later-done", "1") in types and ("later-found", "1") in types

    # The store recorded who registered each event, as the modules were told.
    react, later = "tests.support.hat_modules.react", "tests.support.hat_modules.later"
    assert sources[("event", "engine")] == Source(SourceKind.ENGINE, 0)
    assert sources[("a", "1")] == Source(SourceKind.EVENTER, 2)
    assert sources[("other",)] == Source(SourceKind.EVENTER, 2)
    assert sources[("ra", "1")] == Source(SourceKind.MODULE, 0, react)
    assert sources[("rb", "1")] == Source(SourceKind.MODULE, 1, react)
    assert sources[("counted", "ra", "1")] == Source(
        SourceKind.MODULE, 2, "tests.support.hat_modules.sessions"
    )
    assert sources[("later-done", "1")] == Source(SourceKind.MODULE, 3, later)
    assert sources[("later-found", "1")] == Source(SourceKind.MODULE, 3, later)


def test_a_hat_module_whose_subscription_changes_is_offered_what_hat_event_offers(
    tmp_path: Path,
) -> None:
    """hat-event reads a module's ``subscription`` for every event it offers: a module that
    subscribes to more as it goes is offered the newly matching events from then on, in the
    same round too."""
    modules = [{"module": "tests.support.hat_modules.follow"}, {"module": LATER}]
    sessions = [
        [hat.RegisterEvent(("b", "1"), None, None)],  # not yet followed
        [
            hat.RegisterEvent(("follow", "b"), None, None),
            hat.RegisterEvent(("b", "2"), None, None),  # followed from the event before
        ],
        [hat.RegisterEvent(("b", "3"), None, None), hat.RegisterEvent(("c", "1"), None, None)],
        [hat.RegisterEvent(("later", "1"), None, None)],
    ]

    async def on_tidings() -> list[Session]:
        async with _tidings(tmp_path / "tidings", modules) as (address, _server):
            return await _exercise(address, sessions)

    with hat_event_server(tmp_path, 1, modules=modules, syncer=False) as (port, _, _process):
        on_hat = run(_exercise(local_address(port), sessions), 60)
    ours = run(on_tidings(), 60)
    assert _without_eventer(ours) == _without_eventer(on_hat)
    types = [event_type for session in ours for event_type, _, _ in session]
    assert ("followed", "b", "2") in types and ("followed", "b", "3") in types
    assert ("followed", "b", "1") not in types and ("followed", "c", "1") not in types


def test_a_hat_module_querying_in_process_finds_the_sessions_before_as_on_hat_event(
    tmp_path: Path,
) -> None:
    """hat-event stores each session before it runs the next, so a module's query inside
    ``process`` finds every earlier session. tidings stores sessions registered together
    in one transaction (group commit): with hat modules each is stored before the next
    runs. hat-event's numbers are those of its sessions one by one; tidings' engine gets the
    same sessions as one group (as the write queue passes clients registering at once)."""
    modules = [{"module": "tests.support.hat_modules.query"}]
    sessions = [[hat.RegisterEvent(("n", str(i)), None, None)] for i in range(4)]
    on_hat_modules = [*modules, {"module": LATER}]  # _exercise waits for its events
    later = [hat.RegisterEvent(("later", "1"), None, None)]
    with hat_event_server(tmp_path, 1, modules=on_hat_modules, syncer=False) as (port, _, _p):
        on_hat = run(_exercise(local_address(port), [*sessions, later]), 60)
    hat_seen = [s[1][2].data for s in _without_eventer(on_hat) if s[0][0][0] == "n"]
    assert hat_seen == [0, 1, 2, 3]

    from tidings.events.model import NewEvent
    from tidings.server.engine import Engine
    from tidings.server.modules import load_modules

    store = EventStore(f"sqlite:///{tmp_path / 'grouped.db'}", server_id=1)
    engine = Engine(store, [])
    try:
        load_modules(engine, modules)
        grouped = engine.register_many(
            [[NewEvent(("n", str(i)), None, None, None, None)] for i in range(4)]
        )
        assert all(not isinstance(result, EngineError) for result in grouped)
        seen = {e.type: e.payload for e in store.read(0, 100) if e.type[0] == "seen"}
    finally:
        engine.close()
        store.close()
    assert [seen[("seen", str(i))] for i in range(4)] == [str(n).encode() for n in hat_seen]


def test_a_hat_module_registering_from_session_start_and_stop_is_as_on_hat_event(
    tmp_path: Path,
) -> None:
    """What a module registers from ``on_session_stop`` (spawned: awaited there it would
    wait for the session itself, in hat-event too) is a session of its own, on behalf of
    the module; the sessions are compared as a set, since the spawned ones and the client's
    next register race on both servers."""
    modules = [{"module": "tests.support.hat_modules.stopping"}, {"module": LATER}]
    sessions = [
        [hat.RegisterEvent(("s", "1"), None, None), hat.RegisterEvent(("s", "2"), None, None)],
        [hat.RegisterEvent(("t", "1"), None, None)],
        [hat.RegisterEvent(("s", "3"), None, None)],
        [hat.RegisterEvent(("later", "1"), None, None)],
    ]

    async def on_tidings() -> list[Session]:
        async with _tidings(tmp_path / "tidings", modules) as (address, _server):
            return await _exercise(address, sessions)

    with hat_event_server(tmp_path, 1, modules=modules, syncer=False) as (port, _, _process):
        on_hat = run(_exercise(local_address(port), sessions), 60)
    ours = run(on_tidings(), 60)
    assert sorted(map(repr, _without_eventer(ours))) == sorted(map(repr, _without_eventer(on_hat)))
    stopped = [s for s in ours if s[0][0][0] == "stopped"]
    assert [[t for t, _, _ in s] for s in stopped] == [
        [("stopped", "1"), ("stopped", "2")],
        [("stopped", "3")],
    ]


# --- bad module configurations: clear errors, as hat-event refuses them ---------------------


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (
            {"module": "tests.support.hat_modules.react", "subscriptions": [["a"]]},
            r"module 'tests.support.hat_modules.react': configuration does not match its "
            r"schema tidings-test://react.yaml#: 'prefix' is a required property",
        ),
        (
            {
                "module": "tests.support.hat_modules.react",
                "subscriptions": [["a"]],
                "prefix": "ra",
            },
            r"react.yaml# at prefix: 'ra' is not of type 'array'",
        ),
        (
            {"module": "tests.support.hat_modules.sessions"},
            r"module 'tests.support.hat_modules.sessions': create\(\) failed: "
            r"KeyError\('subscriptions'\)",
        ),
        ({"module": "tests.support.hat_modules.nothing"}, r"cannot import it"),
    ],
    ids=["schema-required", "schema-type", "create-fails", "no-such-module"],
)
def test_a_bad_module_configuration_stops_the_start_naming_the_module(
    tmp_path: Path, entry: dict[str, Any], error: str
) -> None:
    """The server does not start, and says which module and why; the modules created before
    the bad one are closed again (their loop stopped: no thread is left behind)."""
    before = {t.name for t in threading.enumerate()}
    config = _config(tmp_path, free_port(), [MODULES[3], entry])
    with pytest.raises(ModuleLoadError, match=error):
        run(RunningServer.start(config))
    assert "tidings-hat-modules" not in {t.name for t in threading.enumerate()} - before


def test_hat_event_refuses_the_same_configuration(tmp_path: Path) -> None:
    """The reference: hat-event 0.8.5's own server refuses the schema-less entry too."""
    bad = [{"module": "tests.support.hat_modules.react", "subscriptions": [["a"]]}]
    refused = pytest.raises(RuntimeError, match=r"'prefix' is a required property")
    with refused, hat_event_server(tmp_path, 1, modules=bad, syncer=False):
        pass


# --- a hat module that closes itself ends the server, as in hat-event ------------------------

CLOSING = [{"module": "tests.support.hat_modules.closing"}]


async def _register_close(address: str) -> None:
    client = await hat_eventer.connect(address)
    try:
        client.register([hat.RegisterEvent(("close",), None, None)])
        await asyncio.sleep(0.1)  # sent: the server may close the connection now
    finally:
        await client.async_close()


def test_a_hat_module_that_closes_itself_stops_the_server(tmp_path: Path) -> None:
    with hat_event_server(tmp_path, 1, modules=CLOSING, syncer=False) as (port, _, process):
        run(_register_close(local_address(port)))
        process.wait(15)  # hat-event's server ends: its engine closed with the module

    async def main() -> None:
        port = free_port()
        serving = asyncio.ensure_future(serve(_config(tmp_path, port, CLOSING)))
        await asyncio.to_thread(wait_for_port, port, 10)
        await _register_close(local_address(port))
        with pytest.raises(EngineError, match="closing closed itself; the server stops"):
            await asyncio.wait_for(serving, 15)

    before = {t.name for t in threading.enumerate()}
    run(main())
    assert "tidings-hat-modules" not in {t.name for t in threading.enumerate()} - before
    store = EventStore(f"sqlite:///{tmp_path / 'events.db'}")
    try:
        stored = store.read(0, 100)
    finally:
        store.close()
    # The session that closed the module was stored (as hat's engine stores it), nothing
    # after it but the engine's STOPPED (the client's DISCONNECTED found no engine).
    assert [e.type for e in stored][-2:] == [("close",), ("event", "engine")]
    assert stored[-1].payload == b'"STOPPED"'
