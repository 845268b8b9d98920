"""The demo's readers at the end of the chain: FTN18 consumers and intermediary subscribers,
recording what they get and when.

- two reliable consumers of the bank's stream, one pushed over WebSocket and one polling,
  registered under their own component names, and a live one (``LIVE``: no cursor);
- subscribers of the intermediary: one to the withdrawals and the module's alerts (an event
  view), two to a SQL view over the ``account`` table.

Every record keeps the moment it arrived, so the verdict can tell the latency from the
producer's commit (the event's ``time`` / source timestamp) to the reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tidings.demo.alerts import ALERT, WITHDRAWAL
from tidings.intermediary.client.client import IntermediaryClient
from tidings.streams.client import LIVE, StreamEvent, consume

#: The SQL view the subscribers keep: the whole account table.
ACCOUNTS_VIEW = "SELECT id, balance, lim FROM account ORDER BY id"
#: How many subscribers keep that view.
VIEW_SUBSCRIBERS = 2


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event as a reader got it: the outbox event id, its key, and the latency from the
    producer's logging of it to its arrival, in milliseconds."""

    event_id: str
    key: str | None
    latency_ms: float


@dataclass
class ConsumerLog:
    """What one FTN18 consumer received, in arrival order."""

    component: str
    push: bool
    deliveries: list[Delivery] = field(default_factory=list)

    async def handle(self, event: StreamEvent) -> None:
        envelope = event.data if isinstance(event.data, dict) else {}
        logged = envelope.get("time")
        latency = float("nan")
        if isinstance(logged, str):
            latency = (time.time() - datetime.fromisoformat(logged).timestamp()) * 1000
        self.deliveries.append(
            Delivery(str(envelope.get("id")), envelope.get("partitionkey"), latency)
        )


@dataclass
class SubscriberLog:
    """What the intermediary's subscribers received: event-view deliveries, alerts, and
    the latest rows of each SQL-view subscriber."""

    events: list[Delivery] = field(default_factory=list)
    alerts: int = 0
    views: dict[str, list[list[Any]]] = field(default_factory=dict)
    view_updates: int = 0


class Readers:
    """Starts the readers on the running loop and stops them."""

    def __init__(self, stream_url: str, user: str, password: str, intermediary_url: str) -> None:
        self._stream = (stream_url, user, password)
        self._intermediary_url = intermediary_url
        self.consumers = [
            ConsumerLog("DemoPushed", push=True),
            ConsumerLog("DemoPolling", push=False),
        ]
        self.live = ConsumerLog(LIVE, push=True)
        self.subscribers = SubscriberLog()
        self._tasks: list[asyncio.Task[None]] = []
        self._clients: list[IntermediaryClient] = []

    async def start(self) -> None:
        """Start the consumers and connect and subscribe the subscribers."""
        url, user, password = self._stream
        for log in [*self.consumers, self.live]:
            consumer = consume(url, user, password, log.component, log.handle, push=log.push)
            self._tasks.append(asyncio.create_task(consumer, name=f"consumer {log.component}"))
        events = await IntermediaryClient.connect(self._intermediary_url)
        await events.subscribe_events("withdrawals", [list(WITHDRAWAL), list(ALERT)])
        self._clients.append(events)
        self._tasks.append(asyncio.create_task(self._read_events(events), name="event subscriber"))
        for n in range(VIEW_SUBSCRIBERS):
            viewer = await IntermediaryClient.connect(self._intermediary_url)
            await viewer.subscribe_sql(f"accounts{n}", ACCOUNTS_VIEW, rate_hz=20)
            self._clients.append(viewer)
            self._tasks.append(
                asyncio.create_task(self._read_views(viewer), name=f"view subscriber {n}")
            )

    async def _read_events(self, client: IntermediaryClient) -> None:
        log = self.subscribers
        while True:
            message = await client.message()
            if message.get("op") != "event":
                continue
            if tuple(message.get("type", ())) == ALERT:
                log.alerts += 1
                continue
            payload = message.get("payload")
            envelope = payload if isinstance(payload, dict) else {}
            logged_us = message.get("source_timestamp")
            latency = float("nan")
            if isinstance(logged_us, int):
                latency = time.time() * 1000 - logged_us / 1000
            log.events.append(
                Delivery(str(envelope.get("id")), envelope.get("partitionkey"), latency)
            )

    async def _read_views(self, client: IntermediaryClient) -> None:
        log = self.subscribers
        while True:
            message = await client.message()
            if message.get("op") == "view" and "rows" in message:
                log.views[message["key"]] = message["rows"]
                log.view_updates += 1

    def failures(self) -> list[str]:
        """Why each reader that stopped on its own stopped (none should)."""
        return [
            f"reader {task.get_name()} stopped: {type(exc).__name__}: {exc}"
            for task in self._tasks
            if task.done() and not task.cancelled() and (exc := task.exception()) is not None
        ]

    async def stop(self) -> None:
        """Stop the consumers (a reliable one acknowledges what it handled) and close the
        subscribers."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for client in self._clients:
            with contextlib.suppress(Exception):
                await client.close()
