"""``engine.modules`` with both kinds of module in one engine, without a server (as the
relay's ``event_store`` target runs them): one loop, hat's rounds, the sources, a hat
module's own later registrations through the engine's thread, and closing."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tidings.demo.alerts import ALERT, WITHDRAWAL
from tidings.events.model import EventId, NewEvent, json_event
from tidings.events.sources import RELAY_SOURCE, Source, SourceKind
from tidings.server.engine import Engine
from tidings.server.modules import load_modules
from tidings.server.store import EventStore

REACT = "tests.support.hat_modules.react"
LATER = "tests.support.hat_modules.later"


def test_hat_and_tidings_modules_share_the_sessions(tmp_path: Path) -> None:
    store = EventStore(f"sqlite:///{tmp_path / 'events.db'}")
    engine = Engine(store, [])
    try:
        load_modules(
            engine,
            [
                # a tidings module: an alert for each withdrawal of 100 or more
                {"module": "tidings.demo.alerts", "threshold": 100},
                # a hat module answering the alerts, and one registering later
                {"module": REACT, "subscriptions": [["bank", "alerts", "*"]], "prefix": ["seen"]},
                {"module": LATER},
            ],
        )
        withdrawal = {"specversion": "1.0", "id": "w1", "data": {"account": "A", "amount": 150}}
        engine.register(
            [
                json_event(WITHDRAWAL, withdrawal, outbox_event_id="w1"),
                NewEvent(("later", "1")),
            ],
            source=RELAY_SOURCE,
        )
        deadline = time.monotonic() + 15
        while not any(e.type == ("later-found", "1") for e in store.read()):
            assert time.monotonic() < deadline, "the later module registered nothing"
            time.sleep(0.05)
        stored = store.read()
        sources = store.sources_of([e.id for e in stored])
    finally:
        before = {t.name for t in threading.enumerate()}
        engine.close()
        store.close()
    assert "tidings-hat-modules" in before
    assert "tidings-hat-modules" not in {t.name for t in threading.enumerate()}

    types = [e.type for e in stored]
    assert types[:4] == [
        WITHDRAWAL,
        ("later", "1"),
        ALERT,  # added in the first round by the tidings module
        ("seen", "alerts", "LargeWithdrawal"),  # the hat module's answer, in the next round
    ]
    assert types[4:] == [("later-done", "1"), ("later-found", "1")]  # sessions of their own
    answer = json.loads(stored[3].payload or b"")
    assert answer["source"] == ["MODULE", 0] and answer["me"] == ["MODULE", 1]
    assert [sources[e.id] for e in stored] == [
        RELAY_SOURCE,
        RELAY_SOURCE,
        Source(SourceKind.MODULE, 0, "tidings.demo.alerts"),
        Source(SourceKind.MODULE, 1, REACT),
        Source(SourceKind.MODULE, 2, LATER),
        Source(SourceKind.MODULE, 2, LATER),
    ]


@pytest.mark.parametrize("held", [False, True], ids=["each-commit", "periodic"])
def test_a_hat_module_sees_the_id_and_timestamp_each_event_is_stored_under(
    tmp_path: Path, held: bool
) -> None:
    """As in hat-event: the engine numbers and stamps a session before its modules run, as
    the store then stores it, outbox events already stored (not stored again) included;
    also while the store holds its writes for the next commit (``durability: periodic``,
    its counters in memory)."""
    store = EventStore(f"sqlite:///{tmp_path / 'events.db'}")
    if held:
        store.hold_writes()
    engine = Engine(store, [])
    try:
        load_modules(
            engine,
            [
                {
                    "module": "tests.support.hat_modules.ids",
                    "subscriptions": [["t", "*"], ["r", "*"]],
                },
                {"module": REACT, "subscriptions": [["t", "*"]], "prefix": ["r"]},
            ],
        )
        engine.register([NewEvent(("t", "1")), NewEvent(("t", "2"))])
        first = json_event(("t", "o"), 1, outbox_event_id="o1")
        engine.register_many(
            [
                [first],
                [NewEvent(("t", "3")), first, NewEvent(("t", "4"))],  # o1: stored already
                [first],  # nothing to store: no number taken
                [NewEvent(("t", "5"))],
            ]
        )
        store.flush()
        stored = {e.id: e for e in store.read()}
    finally:
        engine.close()
        store.close()
    answers = [e for e in stored.values() if e.type[0] == "id-of"]
    answered = sorted(e.type for e in stored.values() if e.type[0] in ("t", "r"))
    assert sorted(e.type[1:] for e in answers) == answered  # each event once
    assert len(answered) == 12  # t/1..5 and t/o, each answered by react
    for answer in answers:
        shown = json.loads(answer.payload or b"")
        server, session, instance = shown["id"]
        event = stored[EventId(server, session, instance)]
        assert event.type == answer.type[1:]  # the id it was shown is the one it has
        assert shown["timestamp"] == list(divmod(event.timestamp_us, 1_000_000))
        assert answer.id.session == event.id.session  # answered in its own session
