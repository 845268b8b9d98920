"""The chain's far end for the benchmark: an event server process serving a stream, an
intermediary process following it, and the readers (a reliable consumer, a subscriber) on an
event loop in a thread of the benchmark, recording when each event arrived."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench.harness.processes import (
    TIDINGS,
    ServerProcess,
    free_port,
    local_address,
    wait_for_port,
)
from tidings.config.passwords import hash_password
from tidings.intermediary.client.client import IntermediaryClient
from tidings.streams.client import StreamEvent, consume
from tidings.targets.loop_thread import LoopThread

PREFIX = "c"
EVENT_TYPE = "MoneyDeposited"
USER, PASSWORD = "bench", "bench-password"
COMPONENT = "BenchReliable"


@dataclass
class Arrivals:
    """Per outbox event id: when it was logged (the producer's clock, s), when the server
    stored it (its session timestamp, s), and when the consumer and the subscriber got it."""

    logged: dict[str, float] = field(default_factory=dict)
    stored: dict[str, float] = field(default_factory=dict)
    consumed: dict[str, float] = field(default_factory=dict)
    subscribed: dict[str, float] = field(default_factory=dict)

    async def on_stream_event(self, event: StreamEvent) -> None:
        now = time.time()
        data = event.data if isinstance(event.data, dict) else {}
        event_id = str(data.get("id"))
        self.consumed.setdefault(event_id, now)
        if isinstance(data.get("time"), str):
            self.logged.setdefault(event_id, datetime.fromisoformat(data["time"]).timestamp())

    def on_subscriber_message(self, message: dict[str, Any]) -> None:
        now = time.time()
        payload = message.get("payload")
        event_id = str(payload.get("id")) if isinstance(payload, dict) else "?"
        self.subscribed.setdefault(event_id, now)
        if isinstance(message.get("timestamp"), int):
            self.stored.setdefault(event_id, message["timestamp"] / 1e6)


class ChainEnd:
    """The server and intermediary processes and the readers; :meth:`close` stops them."""

    def __init__(self, work: Path) -> None:
        self.work = work
        ports = {"eventer": free_port(), "stream": free_port()}
        self.stream_url = f"http://127.0.0.1:{ports['stream']}/s"
        self.server = ServerProcess(
            [*TIDINGS, "server"],
            work / "server",
            _server_config(ports),
            ports,
        )
        self.intermediary_port = free_port()
        self.arrivals = Arrivals()
        self._loop = LoopThread("bench-chain-readers")
        self._tasks: list[asyncio.Task[None]] = []
        self._intermediary: subprocess.Popen[bytes] | None = None
        self._client: IntermediaryClient | None = None

    @property
    def eventer(self) -> str:
        return self.server.eventer

    def start(self) -> None:
        self.server.start()
        path = self.work / "intermediary.yaml"
        section = {"listen": f"127.0.0.1:{self.intermediary_port}", "event_server": self.eventer}
        path.write_text(yaml.safe_dump({"intermediary": section}))
        log = (self.work / "intermediary.log").open("wb")
        self._intermediary = subprocess.Popen(
            [*TIDINGS, "intermediary", "serve", "-c", str(path), "--log-level", "WARNING"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_port(self.intermediary_port, 30, process=self._intermediary)
        self._loop.run(self._start_readers(), 60)

    async def _start_readers(self) -> None:
        arrivals = self.arrivals
        consumer = consume(self.stream_url, USER, PASSWORD, COMPONENT, arrivals.on_stream_event)
        self._tasks.append(asyncio.create_task(consumer))
        self._client = await IntermediaryClient.connect(f"ws://127.0.0.1:{self.intermediary_port}/")
        await self._client.subscribe_events("e", [[PREFIX, EVENT_TYPE]])
        self._tasks.append(asyncio.create_task(self._subscribed(self._client)))

    async def _subscribed(self, client: IntermediaryClient) -> None:
        while True:
            message = await client.message()
            if message.get("op") == "event":
                self.arrivals.on_subscriber_message(message)

    def wait_consumed(self, count: int, timeout: float) -> float | None:
        """Until the consumer holds ``count`` events; the moment (time.time()) it did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.arrivals.consumed) >= count:
                return max(self.arrivals.consumed.values())
            time.sleep(0.05)
        return None

    def close(self) -> None:
        async def stop() -> None:
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(BaseException):
                    await task
            if self._client is not None:
                await self._client.close()

        if self._loop.started:
            self._loop.run(stop(), 60)
            self._loop.stop()
        if self._intermediary is not None:
            self._intermediary.terminate()
            self._intermediary.wait(30)
        self.server.stop()


def _server_config(ports: dict[str, int]) -> dict[str, Any]:
    return {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": "ev.db"},
        "engine": {"server_id": 1},
        "eventer_server": {"address": local_address(ports["eventer"])},
        "stream_users": {USER: {"password_hash": hash_password(PASSWORD)}},
        "streams": [
            {
                "name": "s",
                "port": ports["stream"],
                "path": "/s",
                "types": {"DEPOSIT": [PREFIX, EVENT_TYPE]},
            }
        ],
    }


def chain_target(eventer: str) -> dict[str, Any]:
    """The relay's target into the chain's server."""
    return {"kind": "event_server", "address": eventer, "type_prefix": [PREFIX]}
