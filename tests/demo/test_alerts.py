"""The demo's server module in a real engine over a real SQLite store: relayed withdrawals
of at least the threshold get an alert in the same session, others none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidings.demo.alerts import ALERT, WITHDRAWAL, create
from tidings.events.model import json_event
from tidings.server.engine import Engine
from tidings.server.modules import load_modules
from tidings.server.store import EventStore


def _withdrawal(amount: object, event_id: str) -> object:
    envelope = {"specversion": "1.0", "id": event_id, "data": {"account": "A", "amount": amount}}
    return json_event(WITHDRAWAL, envelope, outbox_event_id=event_id)


def test_large_withdrawals_get_one_alert_each_in_their_session(tmp_path: Path) -> None:
    store = EventStore(f"sqlite:///{tmp_path / 'events.db'}")
    try:
        engine = Engine(store, [])
        load_modules(engine, [{"module": "tidings.demo.alerts", "threshold": 100}])
        engine.register(
            [_withdrawal(99, "small"), _withdrawal(100, "big"), _withdrawal("x", "odd")]
        )
        engine.register([_withdrawal(100, "big")])  # published again: recognised, no new alert
        stored = store.read(0, limit=100)
    finally:
        store.close()
    alerts = [e for e in stored if e.type == ALERT]
    assert [json.loads(a.payload or b"") for a in alerts] == [
        {"account": "A", "amount": 100, "of": "big"}
    ]
    withdrawal = next(e for e in stored if e.outbox_event_id == "big")
    assert alerts[0].id.session == withdrawal.id.session


@pytest.mark.parametrize("threshold", [0, -5, "10", True])
def test_a_bad_threshold_is_refused(threshold: object) -> None:
    with pytest.raises(ValueError, match="threshold must be a positive integer"):
        create({"threshold": threshold}, None)  # type: ignore[arg-type]
