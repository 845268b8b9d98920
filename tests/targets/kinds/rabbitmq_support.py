"""The shared RabbitMQ broker (127.0.0.1:5672, guest/guest) for the rabbitmq target's tests:
exchanges and queues made and removed with aiormq, messages read back, the broker's
application stopped and started with ``rabbitmqctl`` (a real outage, undone in seconds)."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiormq
from aiormq.abc import AbstractChannel, DeliveredMessage

BROKER = "amqp://guest:guest@127.0.0.1:5672/"
_T = TypeVar("_T")


def admin(action: Callable[[AbstractChannel], Awaitable[_T]]) -> _T:
    """Run ``action`` on a channel of a fresh connection to the shared broker."""

    async def run() -> _T:
        connection = await aiormq.connect(BROKER)
        try:
            return await action(await connection.channel())
        finally:
            await connection.close()

    return asyncio.run(run())


@dataclass
class Topology:
    """A topic exchange and queues of one test, every name unique; :meth:`remove` deletes them."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    exchanges: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)

    @property
    def exchange(self) -> str:
        return f"tidings-test-{self.tag}"

    def declare_exchange(self, kind: str = "topic", name: str | None = None) -> str:
        name = name or self.exchange
        admin(lambda ch: ch.exchange_declare(name, exchange_type=kind, durable=True))
        self.exchanges.append(name)
        return name

    def queue(self, binding: str = "#", exchange: str | None = None) -> str:
        """A durable queue bound to the exchange (none: the default exchange only)."""
        name = f"tidings-test-{self.tag}-{len(self.queues)}"

        async def make(ch: AbstractChannel) -> None:
            await ch.queue_declare(name, durable=True)
            if exchange != "":
                await ch.queue_bind(name, exchange or self.exchange, routing_key=binding)

        self.queues.append(name)
        admin(make)
        return name

    def remove(self) -> None:
        async def remove(ch: AbstractChannel) -> None:
            for queue in self.queues:
                await ch.queue_delete(queue)
            for exchange in self.exchanges:
                await ch.exchange_delete(exchange)

        if broker_up():
            admin(remove)


def messages(queue: str) -> list[DeliveredMessage]:
    """Every message in ``queue``, taken off it (acknowledged), in queue order."""

    async def take(ch: AbstractChannel) -> list[DeliveredMessage]:
        found: list[DeliveredMessage] = []
        while True:
            message = await ch.basic_get(queue, no_ack=True)
            if message.delivery_tag is None:  # Basic.GetEmpty
                return found
            found.append(message)

    return admin(take)


def headers(message: DeliveredMessage) -> dict[str, Any]:
    found = message.header.properties.headers or {}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in found.items()}


def broker_up() -> bool:
    try:
        admin(lambda ch: asyncio.sleep(0))
        return True
    except Exception:
        return False


def _ctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=120)


@contextmanager
def broker_user(name: str, password: str) -> Iterator[None]:
    """A user with every permission on ``/``, deleted afterwards."""
    _ctl("add_user", name, password)
    try:
        _ctl("set_permissions", "-p", "/", name, ".*", ".*", ".*")
        yield
    finally:
        _ctl("delete_user", name)


def stop_broker() -> None:
    """Stop RabbitMQ's application (the node stays up): every connection is closed."""
    _ctl("stop_app")


def start_broker(timeout: float = 120.0) -> None:
    """Start the application again and wait until it takes connections."""
    _ctl("start_app")
    deadline = time.monotonic() + timeout
    while not broker_up():
        if time.monotonic() > deadline:
            raise RuntimeError("RabbitMQ did not come back")
        time.sleep(0.2)
