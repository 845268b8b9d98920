"""The server log's retention (tidings.server.log_retention) on real SQLite stores: hat-like
limits by age and count per type pattern, always the latest of each type, chunks; and what it
never deletes, each reader for real: a registered stream consumer (a running server with a
stream), a Syncer peer (a real Syncer client, connected then gone, within and beyond the
horizon), an intermediary's table load (a real latest-by-key request over the Eventer)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.support.server_helpers import running
from tests.support.stream_helpers import add_events, call, poll, serving, stream_server_config
from tests.support.waiting import run, until
from tidings.client import connect, json_event
from tidings.config.log_retention import LogRetentionConfig
from tidings.config.server import load_server_config
from tidings.events.model import EventId, PayloadKind, StoredEvent
from tidings.server.log_retention import LogRetention, syncer_holder
from tidings.server.store import EventStore
from tidings.server.store.retention import Keep
from tidings.server.syncer.client import SyncerClient
from tidings.server.syncer.server import SyncerServer
from tidings.streams.consumers.positions import Consumers

HOUR_US = 3600 * 1_000_000


def retention(store: EventStore, **config: Any) -> LogRetention:
    return LogRetention(store, LogRetentionConfig.model_validate({"min_age": "0s", **config}))


def old(
    store: EventStore, event_type: tuple[str, ...], count: int, age_us: int, keys: str = ""
) -> list[int]:
    """``count`` events of ``event_type`` stamped ``age_us`` ago (a peer's, server 9, as if
    synced), with the ``keys`` in turn as their payload's key: their positions."""
    now = int(time.time() * 1_000_000) - age_us
    last = store.last_event_id(9)
    events = [
        StoredEvent(
            0,
            EventId(9, last.session + 1, last.instance + 1 + i),
            event_type,
            now + i,
            None,
            json.dumps({"i": i} | ({"key": keys[i % len(keys)]} if keys else {})).encode(),
            PayloadKind.JSON,
            None,
        )
        for i in range(count)
    ]
    return [e.position for e in store.append_synced(events)]


def positions(store: EventStore) -> set[int]:
    return {e.position for e in store.read(0, 1_000_000)}


@pytest.fixture
def store(database_url: str) -> Any:
    """A store on SQLite and on PostgreSQL."""
    opened = EventStore(database_url)
    yield opened
    opened.close()


def test_rules_delete_by_count_and_age_keep_the_latest_of_each_type_and_unmatched_types(
    store: EventStore,
) -> None:
    ay = old(store, ("a", "y"), 3, 0)
    ax = old(store, ("a", "x"), 10, 0)
    b_old = old(store, ("b",), 6, 2 * HOUR_US)
    b_new = old(store, ("b",), 2, 0)
    c = old(store, ("c",), 5, 2 * HOUR_US)  # no rule: kept
    kept_by_a = set(ax[-5:]) | {ay[-1]}  # the newest 5, and a/y's latest
    r = retention(
        store,
        rules=[
            {"subscriptions": [["a", "*"]], "max_entries": 5},
            {"subscriptions": [["b"], ["a", "x"]], "duration": "1h"},  # a/x: the first rule's
        ],
    )
    done = r.run_pass()
    assert positions(store) == kept_by_a | set(b_new) | set(c)
    assert done == {"0: a/*": 7, "1: b a/x": len(b_old)}
    assert r.run_pass() == {}
    assert r.deleted == {"0: a/*": 7, "1: b a/x": len(b_old)}


def test_min_entries_and_min_age_hold_events_the_limits_would_delete(store: EventStore) -> None:
    d = old(store, ("d",), 6, 2 * HOUR_US)
    retention(store, rules=[{"subscriptions": [["d"]], "duration": 1, "min_entries": 4}]).run_pass()
    assert positions(store) == set(d[-4:])
    e = old(store, ("e",), 6, 0)  # younger than min_age: stay
    young = LogRetention(
        store,
        LogRetentionConfig.model_validate(
            {"rules": [{"subscriptions": [["e"]], "max_entries": 0}], "min_age": "1h"}
        ),
    )
    assert young.run_pass() == {}
    assert set(e) <= positions(store)


def test_a_pass_goes_past_chunks_of_events_that_stay(store: EventStore) -> None:
    f = old(store, ("f",), 1, 0)  # the latest of its type: examined first, stays
    kept = old(store, ("g",), 3, 0)
    g = old(store, ("g",), 5, 0)
    r = retention(store, rules=[{"subscriptions": [["*"]], "max_entries": 0}], batch=1)
    r.hold("a reader", lambda: [Keep([("g",)], kept[-1])])  # g events after these
    assert r.run_pass() == {"0: *": 3}
    assert positions(store) == set(f) | set(g)


def test_a_consumer_registered_during_a_pass_holds_its_events_from_the_next_chunk(
    store: EventStore,
) -> None:
    orders = old(store, ("o",), 6, 0)
    consumers = Consumers(store)  # the streams' real consumer table, in the same store

    def stream_consumers() -> list[Keep]:
        lowest = consumers.lowest_position("s")
        return [] if lowest is None else [Keep([("o",)], lowest)]

    asked: list[int] = []

    def registers_during_the_pass() -> list[Keep]:
        asked.append(1)
        if len(asked) == 2:  # the first chunk is deleted: a consumer registers now
            consumers.register("s", "u", "A")
        return []

    r = retention(store, rules=[{"subscriptions": [["o"]], "max_entries": 0}], batch=1)
    r.hold("registers", registers_during_the_pass)
    r.hold("stream consumers", stream_consumers)
    r.run_pass()
    assert len(asked) > 1, "the readers were asked once a pass, not before each chunk"
    assert positions(store) == set(orders[1:])  # only the chunk before it registered went


def test_a_table_loaded_during_a_pass_holds_the_newest_of_its_keys_from_the_next_chunk(
    store: EventStore,
) -> None:
    rows = old(store, ("rows", "t"), 9, 0, keys="xyz")  # x y z x y z x y z
    r = retention(store, rules=[{"subscriptions": [["rows", "*"]], "max_entries": 0}], batch=1)
    asked: list[int] = []

    def loads_during_the_pass() -> list[Keep]:
        asked.append(1)
        if len(asked) == 2:  # the first chunk is deleted: an intermediary loads the table
            r.table_loaded(("rows", "t"))
        return []

    r.hold("loads", loads_during_the_pass)
    r.run_pass()
    assert positions(store) == set(rows[-3:])


def test_listed_tables_keep_the_newest_event_of_every_key(store: EventStore) -> None:
    rows = old(store, ("rows", "t"), 9, 0, keys="xyz")  # x y z x y z x y z
    other = old(store, ("rows", "u"), 4, 0, keys="xy")
    r = retention(
        store, rules=[{"subscriptions": [["rows", "*"]], "max_entries": 0}], tables=[["rows", "t"]]
    )
    assert r.run_pass() == {"0: rows/*": 6 + 3}
    assert positions(store) == set(rows[-3:]) | {other[-1]}


def test_loaded_tables_are_remembered_up_to_a_bound(
    store: EventStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import tidings.server.log_retention as log_retention

    monkeypatch.setattr(log_retention, "MAX_LOADED_TABLES", 1)
    t = old(store, ("rows", "t"), 4, 0, keys="xy")
    u = old(store, ("rows", "u"), 4, 0, keys="xy")
    r = retention(store, rules=[{"subscriptions": [["rows", "*"]], "max_entries": 0}])
    with caplog.at_level(logging.WARNING, logger="tidings.server.log_retention"):
        for event_type in [("rows", "t"), ("rows", "u"), ("rows", "v")]:
            r.table_loaded(event_type)
    assert caplog.text.count("no more are remembered") == 1
    r.run_pass()
    assert positions(store) == set(t[-2:]) | {u[-1]}


def test_the_configuration_is_checked() -> None:
    with pytest.raises(ValidationError, match="give duration, max_entries or both"):
        LogRetentionConfig.model_validate({"rules": [{"subscriptions": [["a"]]}]})
    with pytest.raises(ValidationError, match="at least one event type pattern"):
        LogRetentionConfig.model_validate({"rules": [{"subscriptions": [], "duration": 5}]})
    with pytest.raises(ValidationError, match="rules"):
        LogRetentionConfig.model_validate({"rules": []})
    with pytest.raises(ValidationError, match="max_entries"):
        LogRetentionConfig.model_validate(
            {"rules": [{"subscriptions": [["a"]], "max_entries": -1}]}
        )
    with pytest.raises(ValidationError, match=r"\*"):
        LogRetentionConfig.model_validate(
            {"rules": [{"subscriptions": [["*", "a"]], "duration": 1}]}
        )
    parsed = LogRetentionConfig.model_validate(
        {"rules": [{"subscriptions": [["a", "*"]], "duration": "7d", "max_entries": 10}]}
    )
    assert parsed.rules[0].duration is not None and parsed.rules[0].duration.days == 7


@pytest.mark.sockets
def test_a_registered_stream_consumer_holds_what_it_has_not_acknowledged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    config = stream_server_config(url, secure_channel=True)
    config["retention"] = {
        "rules": [{"subscriptions": [["orders", "*"]], "max_entries": 0}],
        "min_age": "0s",
        "every": "50ms",
    }

    def stored() -> set[int]:
        s = EventStore(url)
        try:
            return positions(s)
        finally:
            s.close()

    async def scenario() -> None:
        async with serving(config) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "A"})
            orders = await add_events(server.url, 10, "ORDER")
            await poll(server.url, "A", orders[3])  # A has acknowledged the first four
            await until(lambda: not set(orders[:4]) & stored(), 10)
            assert set(orders[4:]) <= stored()  # not acknowledged: held
            await poll(server.url, "A", orders[-1])
            await until(lambda: not set(orders[:-1]) & stored(), 10)
            assert orders[-1] in stored()  # the latest of its type

    run(scenario(), timeout=60)


@pytest.mark.sockets
def test_a_syncer_peer_holds_what_it_was_not_sent_until_beyond_the_horizon(
    tmp_path: Path,
) -> None:
    from tests.support.server_helpers import async_engine

    async def scenario() -> None:
        async with (
            async_engine(tmp_path / "a.db", server_id=1) as a,
            async_engine(tmp_path / "b.db", server_id=2) as b,
        ):
            syncer = await SyncerServer.start("tcp+sbs://127.0.0.1:0", a)
            try:
                sent = [(await a.register([json_event(("t",), {"i": i})]))[0] for i in range(5)]
                client = SyncerClient(f"tcp+sbs://127.0.0.1:{syncer.port}", b, 1, min_delay=0.1)
                await client.start()
                await client.wait_synced(15)
                await until(lambda: b.store.last_event_id(1) >= sent[-1].id, 10)
                await client.aclose()
                await until(lambda: not syncer.clients, 10)
                unsent = [(await a.register([json_event(("t",), {"i": i})]))[0] for i in range(5)]
                rules = [{"subscriptions": [["t"]], "max_entries": 0}]
                within = retention(a.store, rules=rules, peer_horizon="1h")
                within.hold("syncer peers", syncer_holder(a.store, syncer, 3600))
                within.run_pass()
                left = {e.position for e in a.store.read(0, 1000) if e.type == ("t",)}
                assert left == {e.position for e in unsent}  # sent ones went
                beyond = retention(a.store, rules=rules, peer_horizon="0s")
                beyond.hold("syncer peers", syncer_holder(a.store, syncer, 0))
                time.sleep(0.01)
                beyond.run_pass()
                left = {e.position for e in a.store.read(0, 1000) if e.type == ("t",)}
                assert left == {unsent[-1].position}  # only the latest of the type
            finally:
                await syncer.aclose()

    run(scenario(), timeout=60)


@pytest.mark.sockets
def test_a_table_load_holds_the_newest_event_of_every_key(tmp_path: Path) -> None:
    r: list[LogRetention] = []

    def loaded(event_type: tuple[str, ...]) -> None:
        r[0].table_loaded(event_type)

    async def scenario() -> None:
        async with running(tmp_path, on_table_load=loaded) as server:
            r.append(
                retention(
                    server.store,
                    rules=[{"subscriptions": [["rows", "*"]], "max_entries": 0}],
                    tables=[["rows", "listed"]],
                )
            )
            for table in ("loaded", "listed", "other"):
                for version in range(3):
                    await server.engine.register(
                        [json_event(("rows", table), {"key": k, "v": version}) for k in "xyz"]
                    )
            client = await connect(server.address)
            try:
                newest = await client.query_latest_by_key(["rows", "loaded"])
            finally:
                await client.aclose()
            assert len(newest) == 3
            listed = [e for e in server.store.read(0, 1000) if e.type == ("rows", "listed")][-3:]
            r[0].run_pass()
            left = {e.id: e for e in server.store.read(0, 1000) if e.type[0] == "rows"}
            other = max(i for i, e in left.items() if e.type == ("rows", "other"))
            # the newest of each key loaded or listed, and the latest of the other type
            assert set(left) == {e.id for e in newest} | {e.id for e in listed} | {other}
            assert {json.loads(left[e.id].payload or b"")["v"] for e in newest} == {2}

    run(scenario(), timeout=60)


def test_a_server_runs_its_retention_in_the_background(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tidings.server.runner import RunningServer

    config = load_server_config(
        {
            "type": "event",
            "backend": {"module": "tidings.server.backends.sqlite", "db_path": "e.db"},
            "engine": {"server_id": 1},
            "eventer_server": {"address": "tcp+sbs://127.0.0.1:0"},
            "retention": {
                "rules": [{"subscriptions": [["n"]], "max_entries": 2}],
                "min_age": "0s",
                "every": "20ms",
            },
        },
        base_dir=tmp_path,
    )

    async def scenario() -> None:
        server = await RunningServer.start(config)
        try:
            for i in range(10):
                await server.engine.register([json_event(("n",), {"i": i})])

            def count() -> int:
                return sum(1 for e in server.store.read(0, 1000) if e.type == ("n",))

            await until(lambda: count() == 2, 10)
            assert server.retention is not None
            assert server.retention.deleted == {"0: n": 8}
        finally:
            await server.aclose()

    with caplog.at_level(logging.INFO, logger="tidings.server.log_retention"):
        run(scenario(), timeout=60)
    assert "server log retention deleted events" in caplog.text
