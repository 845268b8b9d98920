"""Engine processing sessions with real modules on a real SQLite event store."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidings.errors import EngineError, ModuleLoadError, TidingsError
from tidings.events.model import NewEvent, PayloadKind, StoredEvent
from tidings.server.engine import ENGINE_EVENT_TYPE, Engine, Module, SessionEvent
from tidings.server.modules import load_module
from tidings.server.store import EventStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    event_store = EventStore(f"sqlite:///{tmp_path / 'events.db'}")
    yield event_store
    event_store.close()


def ev(*segments: str, payload: bytes | None = None) -> NewEvent:
    return NewEvent(segments, payload, None if payload is None else PayloadKind.BINARY)


class Recorder:
    """Records every call in a log shared by all modules of a test."""

    def __init__(
        self,
        name: str,
        log: list[tuple[str, ...]],
        subscription: tuple[tuple[str, ...], ...] = (("*",),),
    ) -> None:
        self.name = name
        self.log = log
        self.subscription = subscription

    def on_session_start(self, session_id: int) -> None:
        self.log.append((self.name, "start", str(session_id)))

    def process(self, session_id: int, event: SessionEvent) -> list[NewEvent]:
        self.log.append((self.name, "process", "/".join(event.type)))
        return self.react(event)

    def react(self, event: SessionEvent) -> list[NewEvent]:
        return []

    def on_session_stop(self, session_id: int) -> None:
        self.log.append((self.name, "stop", str(session_id)))


class Echo(Recorder):
    """Answers each ('ping', x) with ('pong', x)."""

    def react(self, event: SessionEvent) -> list[NewEvent]:
        if event.type[0] == "ping":
            return [ev("pong", *event.type[1:])]
        return []


class Follow(Recorder):
    """Answers each ('pong', x) with ('done', x)."""

    def react(self, event: SessionEvent) -> list[NewEvent]:
        if event.type[0] == "pong":
            return [ev("done", *event.type[1:])]
        return []


class Loop(Recorder):
    """Answers every event with another one: never ends on its own."""

    def react(self, event: SessionEvent) -> list[NewEvent]:
        return [ev("loop", str(event.instance))]


class Crash(Recorder):
    def react(self, event: SessionEvent) -> list[NewEvent]:
        if event.type == ("boom",):
            raise RuntimeError("kaboom")
        return []


def calls(log: list[tuple[str, ...]], kind: str) -> list[tuple[str, ...]]:
    return [entry for entry in log if entry[1] == kind]


def test_modules_satisfy_the_protocol() -> None:
    assert isinstance(Recorder("r", []), Module)


def test_added_events_share_session_and_timestamp(store: EventStore) -> None:
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Echo("echo", log), Follow("follow", log)])
    result = engine.register([ev("ping", "1"), ev("other")])
    assert [None if e is None else e.type for e in result] == [("ping", "1"), ("other",)]
    stored = store.read()
    assert [e.type for e in stored] == [("ping", "1"), ("other",), ("pong", "1"), ("done", "1")]
    assert len({e.id.session for e in stored}) == 1
    assert len({e.timestamp_us for e in stored}) == 1
    assert [e.id.instance for e in stored] == [1, 2, 3, 4]
    assert result == stored[:2]


def test_module_order_and_added_events_seen_by_all(store: EventStore) -> None:
    log: list[tuple[str, ...]] = []
    # hat-event 0.8.5's rounds: each round module by module, each module over the round's
    # events in order. Follow comes first, so it sees the pongs the later Echo module added
    # in the next round, and Echo sees its own pongs and Follow's dones.
    engine = Engine(store, [Follow("follow", log), Echo("echo", log)])
    engine.register([ev("ping", "a"), ev("ping", "b")])
    assert calls(log, "process") == [
        ("follow", "process", "ping/a"),
        ("follow", "process", "ping/b"),
        ("echo", "process", "ping/a"),
        ("echo", "process", "ping/b"),
        ("follow", "process", "pong/a"),
        ("follow", "process", "pong/b"),
        ("echo", "process", "pong/a"),
        ("echo", "process", "pong/b"),
        ("follow", "process", "done/a"),
        ("follow", "process", "done/b"),
        ("echo", "process", "done/a"),
        ("echo", "process", "done/b"),
    ]
    assert [e.type for e in store.read()] == [
        ("ping", "a"),
        ("ping", "b"),
        ("pong", "a"),
        ("pong", "b"),
        ("done", "a"),
        ("done", "b"),
    ]


def test_subscription_filters_events(store: EventStore) -> None:
    log: list[tuple[str, ...]] = []
    engine = Engine(
        store,
        [
            Echo("echo", log, subscription=(("ping", "?"),)),
            Recorder("dones", log, subscription=(("done", "*"),)),
            Recorder("nothing", log, subscription=()),
        ],
    )
    engine.register([ev("ping", "1"), ev("ping", "1", "2"), ev("done")])
    assert calls(log, "process") == [
        ("echo", "process", "ping/1"),
        ("dones", "process", "done"),
    ]
    assert [e.type for e in store.read()] == [
        ("ping", "1"),
        ("ping", "1", "2"),
        ("done",),
        ("pong", "1"),
    ]


@pytest.mark.parametrize(
    "bad_type",
    [("a", "?"), ("*",), (), ("a", 1), "a/b", None],
    ids=["question", "star", "empty", "non-str", "str", "none"],
)
def test_invalid_type_fails_only_that_event(store: EventStore, bad_type: object) -> None:
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Echo("echo", log)])
    result = engine.register([ev("ping", "x"), NewEvent(bad_type), ev("ok")])  # type: ignore[arg-type]
    assert result[1] is None
    assert result[0] is not None and result[0].type == ("ping", "x")
    assert result[2] is not None and result[2].type == ("ok",)
    assert [e.type for e in store.read()] == [("ping", "x"), ("ok",), ("pong", "x")]
    assert ("echo", "process", "ping/x") in log


def test_all_invalid_runs_no_session(store: EventStore) -> None:
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Recorder("r", log)])
    assert engine.register([NewEvent(("*",))]) == [None]
    assert engine.register([]) == []
    assert log == []
    assert store.count() == 0


def test_runaway_loop_is_stopped_and_nothing_stored(store: EventStore) -> None:
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Recorder("first", log), Loop("looper", log)], max_session_events=50)
    with pytest.raises(EngineError, match=r"module looper last.*Nothing was stored") as info:
        engine.register([ev("seed")])
    assert isinstance(info.value, TidingsError)
    assert store.count() == 0
    assert calls(log, "stop") == [("first", "stop", "1"), ("looper", "stop", "1")]
    # The engine is usable afterwards.
    engine2 = Engine(store, [Recorder("first", log)])
    assert engine2.register([ev("after")])[0] is not None


def test_module_exception_aborts_session(store: EventStore) -> None:
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Echo("echo", log), Crash("crasher", log)])
    with pytest.raises(EngineError, match=r"module crasher failed in process.*kaboom") as info:
        engine.register([ev("ping", "1"), ev("boom")])
    assert isinstance(info.value.__cause__, RuntimeError)
    assert store.count() == 0
    assert calls(log, "stop") == [("echo", "stop", "1"), ("crasher", "stop", "1")]
    assert engine.register([ev("fine")])[0] is not None


def test_module_adding_invalid_event_aborts_session(store: EventStore) -> None:
    class Bad(Recorder):
        def react(self, event: SessionEvent) -> list[NewEvent]:
            return [NewEvent(("x", "*"))]

    engine = Engine(store, [Bad("bad", [])])
    # The store's own reason, without the store's "event N: " prefix.
    reason = r"type \('x', '\*'\) has segment '\*', which is reserved as a query wildcard"
    with pytest.raises(EngineError, match=r"module bad added an invalid event \(#0\): " + reason):
        engine.register([ev("a")])
    assert store.count() == 0


def test_session_start_and_stop_once_each_in_module_order(store: EventStore) -> None:
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Echo("a", log), Follow("b", log), Recorder("c", log)])
    engine.register([ev("ping", "1")])
    engine.register([ev("ping", "2")])
    starts_stops = [entry for entry in log if entry[1] in ("start", "stop")]
    assert starts_stops == [
        ("a", "start", "1"),
        ("b", "start", "1"),
        ("c", "start", "1"),
        ("a", "stop", "1"),
        ("b", "stop", "1"),
        ("c", "stop", "1"),
        ("a", "start", "2"),
        ("b", "start", "2"),
        ("c", "start", "2"),
        ("a", "stop", "2"),
        ("b", "stop", "2"),
        ("c", "stop", "2"),
    ]
    # All processing of a session lies between its starts and its stops.
    first_stop = log.index(("a", "stop", "1"))
    assert all(entry[1] != "process" for entry in log[first_stop : first_stop + 3])
    assert log.index(("c", "start", "1")) < log.index(("a", "process", "ping/1")) < first_stop


def test_failing_session_start_stops_only_started_modules(store: EventStore) -> None:
    log: list[tuple[str, ...]] = []

    class BadStart(Recorder):
        def on_session_start(self, session_id: int) -> None:
            raise ValueError("no start")

    engine = Engine(store, [Recorder("a", log), BadStart("b", log), Recorder("c", log)])
    with pytest.raises(EngineError, match=r"module b failed in on_session_start"):
        engine.register([ev("x")])
    assert [e for e in log if e[1] in ("start", "stop")] == [
        ("a", "start", "1"),
        ("a", "stop", "1"),
        ("b", "stop", "1"),
    ]
    assert store.count() == 0


def test_register_inside_process_is_refused(store: EventStore) -> None:
    class Reentrant(Recorder):
        engine: Engine

        def react(self, event: SessionEvent) -> list[NewEvent]:
            self.engine.register([ev("nested")])
            return []

    module = Reentrant("re", [])
    engine = Engine(store, [module])
    module.engine = engine
    with pytest.raises(EngineError, match=r"module re failed in process.*during a session"):
        engine.register([ev("a")])
    assert store.count() == 0


def test_engine_started_and_stopped_events(store: EventStore) -> None:
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Recorder("r", log, subscription=(("event", "engine"),))])
    started = engine.start()
    stopped = engine.stop()
    for stored, status in ((started, "STARTED"), (stopped, "STOPPED")):
        assert stored.type == ENGINE_EVENT_TYPE == ("event", "engine")
        assert stored.payload_kind is PayloadKind.JSON
        assert stored.payload is not None and json.loads(stored.payload) == status
        assert stored.source_timestamp_us is None
    assert stopped.id.session == started.id.session + 1
    assert store.read() == [started, stopped]
    assert calls(log, "process") == [("r", "process", "event/engine")] * 2


def test_callbacks_get_each_session_once(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    received: list[list[StoredEvent]] = []
    other: list[list[StoredEvent]] = []

    def broken(events: list[StoredEvent]) -> None:
        raise RuntimeError("subscriber down")

    engine = Engine(store, [Echo("echo", []), Crash("crash", [])])
    engine.on_registered(received.append)
    engine.on_registered(broken)
    remove_other = engine.on_registered(other.append)
    with caplog.at_level(logging.ERROR, logger="tidings.server.engine"):
        engine.register([ev("ping", "1")])
    assert "callback" in caplog.text and "subscriber down" in caplog.text
    remove_other()
    engine.register([ev("a"), ev("b")])
    with pytest.raises(EngineError):
        engine.register([ev("boom")])  # aborted sessions are not delivered
    assert [[e.type for e in session] for session in received] == [
        [("ping", "1"), ("pong", "1")],
        [("a",), ("b",)],
    ]
    assert received == [store.read()[:2], store.read()[2:]]
    assert len(other) == 1


def test_callbacks_skip_outbox_duplicates(store: EventStore) -> None:
    received: list[list[StoredEvent]] = []
    engine = Engine(store, [])
    engine.on_registered(received.append)
    first = NewEvent(("t",), outbox_event_id="o-1")
    [stored] = engine.register([first])
    again = engine.register([first, NewEvent(("u",), outbox_event_id="o-2")])
    assert again[0] == stored
    assert engine.register([first]) == [stored]
    assert [[e.type for e in session] for session in received] == [[("t",)], [("u",)]]


def test_invalid_subscription_names_module(store: EventStore) -> None:
    with pytest.raises(EngineError, match=r"module bad: invalid subscription"):
        Engine(store, [Recorder("bad", [], subscription=(("*", "a"),))])
    with pytest.raises(EngineError, match=r"max_session_events"):
        Engine(store, [], max_session_events=0)


# --- load_module --------------------------------------------------------------------------


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    package = tmp_path / "modules"
    package.mkdir()
    monkeypatch.syspath_prepend(str(package))
    yield package
    for name in [n for n in sys.modules if n.startswith("tidings_test_mod_")]:
        del sys.modules[name]


def test_load_module_calls_create(store: EventStore, module_dir: Path) -> None:
    (module_dir / "tidings_test_mod_good.py").write_text(
        "class Tagger:\n"
        "    subscription = (('in',),)\n"
        "    def __init__(self, config, engine):\n"
        "        self.tag = config['tag']\n"
        "        self.engine = engine\n"
        "    def on_session_start(self, session_id):\n"
        "        pass\n"
        "    def process(self, session_id, event):\n"
        "        from tidings.events.model import NewEvent\n"
        "        return [NewEvent(('out', self.tag))]\n"
        "    def on_session_stop(self, session_id):\n"
        "        pass\n"
        "def create(config, engine):\n"
        "    return Tagger(config, engine)\n"
    )
    engine = Engine(store, [])
    module = load_module("tidings_test_mod_good", {"module": "x", "tag": "t1"}, engine)
    assert module.engine is engine  # type: ignore[attr-defined]
    engine = Engine(store, [module])
    engine.register([ev("in")])
    assert [e.type for e in store.read()] == [("in",), ("out", "t1")]


def test_load_module_bad_path(store: EventStore) -> None:
    engine = Engine(store, [])
    with pytest.raises(ModuleLoadError, match=r"module 'no_such_mod_xyz': cannot import") as info:
        load_module("no_such_mod_xyz", {}, engine)
    assert isinstance(info.value, TidingsError)
    with pytest.raises(ModuleLoadError, match=r"module '': cannot import"):
        load_module("", {}, engine)


def test_load_module_without_create(store: EventStore, module_dir: Path) -> None:
    (module_dir / "tidings_test_mod_nocreate.py").write_text("x = 1\n")
    (module_dir / "tidings_test_mod_badcreate.py").write_text(
        "def create(config, engine):\n    raise KeyError('tag')\n"
    )
    (module_dir / "tidings_test_mod_notmodule.py").write_text(
        "def create(config, engine):\n    return 42\n"
    )
    engine = Engine(store, [])
    with pytest.raises(ModuleLoadError, match=r"'tidings_test_mod_nocreate': has no create"):
        load_module("tidings_test_mod_nocreate", {}, engine)
    with pytest.raises(ModuleLoadError, match=r"'tidings_test_mod_badcreate': create\(\) failed"):
        load_module("tidings_test_mod_badcreate", {}, engine)
    with pytest.raises(ModuleLoadError, match=r"'tidings_test_mod_notmodule'.*returned int"):
        load_module("tidings_test_mod_notmodule", {}, engine)


def test_register_many_runs_sessions_in_order_and_an_aborted_one_fails_alone(
    store: EventStore,
) -> None:
    class Refuser:
        subscription = (("refuse",),)

        def on_session_start(self, session_id: int) -> None: ...

        def process(self, session_id: int, event: SessionEvent) -> list[NewEvent]:
            raise RuntimeError("no")

        def on_session_stop(self, session_id: int) -> None: ...

    engine = Engine(store, [Refuser()])
    seen: list[list[StoredEvent]] = []
    engine.on_registered(seen.append)
    results = engine.register_many([[ev("a")], [ev("refuse")], [ev("b", "*")], [ev("c")]])
    assert isinstance(results[1], EngineError)
    assert results[2] == [None]
    first, last = results[0], results[3]
    assert isinstance(first, list) and isinstance(last, list)
    assert first[0] is not None and last[0] is not None
    assert first[0].id.session + 1 == last[0].id.session
    assert [[e.type for e in batch] for batch in seen] == [[("a",)], [("c",)]]
    assert [e.type for e in store.read(0, 10)] == [("a",), ("c",)]


# --- outbox events published again --------------------------------------------------------


def outbox_ev(outbox_id: str, *segments: str) -> NewEvent:
    return NewEvent(segments or ("ping", outbox_id), outbox_event_id=outbox_id)


def test_a_stored_outbox_event_is_not_offered_to_modules_again(store: EventStore) -> None:
    """A relay publishes a batch again after a crash: the events it stored already are
    neither stored nor processed again; only the new one is, in a session of its own."""
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Echo("echo", log)])
    first = engine.register([outbox_ev("o1"), outbox_ev("o2")])
    again = engine.register([outbox_ev("o1"), outbox_ev("o2"), outbox_ev("o3")])
    assert again[:2] == first
    assert calls(log, "process") == [
        ("echo", "process", "ping/o1"),
        ("echo", "process", "ping/o2"),
        ("echo", "process", "pong/o1"),
        ("echo", "process", "pong/o2"),
        ("echo", "process", "ping/o3"),
        ("echo", "process", "pong/o3"),
    ]
    assert [e.type for e in store.read()] == [
        ("ping", "o1"),
        ("ping", "o2"),
        ("pong", "o1"),
        ("pong", "o2"),
        ("ping", "o3"),
        ("pong", "o3"),
    ]
    # A batch made only of stored events runs no session at all.
    log.clear()
    assert engine.register([outbox_ev("o3"), outbox_ev("o1")]) == [store.read()[4], first[0]]
    assert log == []
    assert store.count() == 6


def test_an_outbox_event_repeated_within_a_call_is_offered_once(store: EventStore) -> None:
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Recorder("r", log)])
    results = engine.register_many([[outbox_ev("o1"), outbox_ev("o1")], [outbox_ev("o1")]])
    assert calls(log, "process") == [("r", "process", "ping/o1")]
    assert [len(r) for r in results if isinstance(r, list)] == [2, 1]
    stored = store.read()
    assert len(stored) == 1 and results == [[stored[0]] * 2, [stored[0]]]
    # The same outbox id under another type is another event (another target's prefix).
    engine.register([outbox_ev("o1", "other", "o1")])
    assert calls(log, "process")[-1] == ("r", "process", "other/o1")


def test_an_aborted_session_does_not_hide_its_outbox_events(store: EventStore) -> None:
    """A session a module aborts stores nothing: a later session of the same call with
    the same outbox event is processed and stored."""
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Crash("crash", log)])
    results = engine.register_many([[outbox_ev("o1"), NewEvent(("boom",))], [outbox_ev("o1")]])
    assert isinstance(results[0], EngineError)
    assert calls(log, "process") == [
        ("crash", "process", "ping/o1"),
        ("crash", "process", "boom"),
        ("crash", "process", "ping/o1"),
    ]
    assert [e.type for e in store.read()] == [("ping", "o1")]


def test_held_writes_are_seen_as_stored(store: EventStore) -> None:
    """With ``durability: periodic`` the first store is not committed yet when the event
    comes again: the look-up runs in the held transaction, so it is processed once."""
    store.hold_writes()
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Echo("echo", log)])
    engine.register([outbox_ev("o1")])
    assert store.unflushed
    engine.register([outbox_ev("o1")])
    store.flush()
    assert calls(log, "process") == [
        ("echo", "process", "ping/o1"),
        ("echo", "process", "pong/o1"),
    ]
    assert [e.type for e in store.read()] == [("ping", "o1"), ("pong", "o1")]


def test_strict_refuses_the_whole_session_for_one_invalid_event(store: EventStore) -> None:
    log: list[tuple[str, ...]] = []
    engine = Engine(store, [Recorder("r", log)])
    with pytest.raises(EngineError, match=r"session 1: event 1 refused: .*nothing was stored"):
        engine.register([ev("a"), NewEvent(("*",))], strict=True)
    assert log == [] and store.count() == 0
    assert engine.register([ev("a"), NewEvent(("*",))])[1] is None  # not strict: alone
    assert store.count() == 1
