"""The demo's server module: it reacts to relayed events, showing that modules see them.

Loaded by the demo's event server (``engine.modules: [{module: tidings.demo.alerts}]``), it
is offered every ``[bank, MoneyWithdrawn]`` event the relay delivers, and for a withdrawal of
at least ``threshold`` it adds a ``[bank, alerts, LargeWithdrawal]`` event to the same session,
naming the account, the amount and the outbox event id of the withdrawal. The demo's verdict
then counts, in the store, one alert per large committed withdrawal: no more (a re-published
batch is recognised by its outbox ids and not processed again), no fewer.
"""

from __future__ import annotations

import json
from typing import Any

from tidings.events.matching import QueryType
from tidings.events.model import NewEvent, json_event
from tidings.server.engine import Engine, SessionEvent

WITHDRAWAL: tuple[str, ...] = ("bank", "MoneyWithdrawn")
ALERT: tuple[str, ...] = ("bank", "alerts", "LargeWithdrawal")
DEFAULT_THRESHOLD = 450


class LargeWithdrawals:
    """Adds an alert for each withdrawal of at least ``threshold``."""

    name = "large-withdrawals"

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.subscription: tuple[QueryType, ...] = (WITHDRAWAL,)

    def on_session_start(self, session_id: int) -> None:
        """Nothing to prepare: each event is judged alone."""

    def process(self, session_id: int, event: SessionEvent) -> list[NewEvent]:
        data = _data(event.payload)
        amount = data.get("amount")
        if not isinstance(amount, int) or amount < self.threshold:
            return []
        alert = {"account": data.get("account"), "amount": amount, "of": event.outbox_event_id}
        return [json_event(ALERT, alert)]

    def on_session_stop(self, session_id: int) -> None:
        """Nothing to finish."""


def _data(payload: bytes | None) -> dict[str, Any]:
    """The event's own data: the CloudEvents envelope's ``data``, or the bare payload."""
    try:
        value = json.loads(payload or b"null")
    except ValueError:
        return {}
    if isinstance(value, dict) and "specversion" in value:
        value = value.get("data")
    return value if isinstance(value, dict) else {}


def create(config: dict[str, Any], engine: Engine) -> LargeWithdrawals:
    """The module, as the engine loads it (``threshold``: the smallest amount alerted)."""
    threshold = config.get("threshold", DEFAULT_THRESHOLD)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"threshold must be a positive integer, not {threshold!r}")
    return LargeWithdrawals(threshold)
