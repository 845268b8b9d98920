"""RabbitMQ streams on the shared broker (127.0.0.1:5552, guest/guest) for the
``rabbitmq_stream`` target's tests and benchmark: streams made and deleted with rstream's
client, and read back from the first offset with rstream's own ``Consumer``."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder
from rstream.client import Client

HOST, PORT = "127.0.0.1", 5552


@dataclass(frozen=True)
class Read:
    """One message read back: its offset, body, properties and application properties."""

    offset: int
    body: bytes
    message_id: str
    properties: dict[str, Any]

    @property
    def seq(self) -> int:
        return int(self.properties["Tidings-Seq"])

    @property
    def key(self) -> str:
        return str(self.properties.get("Tidings-Partition-Key", ""))


def stream_name() -> str:
    return f"tidings-test-{uuid.uuid4().hex[:12]}"


async def _client() -> Client:
    client = Client(HOST, PORT, frame_max=1_048_576, heartbeat=60, connection_name="tests")
    await client.start()
    await client.authenticate("/", "guest", "guest")
    return client


def admin(action: str, stream: str) -> None:
    """``create`` or ``delete`` ``stream`` (deleting a missing one is no error)."""

    async def run() -> None:
        client = await _client()
        try:
            if action == "create":
                await client.create_stream(stream)
            elif await client.stream_exists(stream):
                await client.delete_stream(stream)
        finally:
            await client.close()

    asyncio.run(run())


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def read_stream(stream: str, expected: int, timeout: float = 30.0) -> list[Read]:
    """The stream's messages from its first offset: once ``expected`` have come and no more
    for a moment (a duplicate would come right behind), or at ``timeout``."""

    async def run() -> list[Read]:
        found: list[Read] = []

        async def take(message: AMQPMessage, context: Any) -> None:
            props = message.application_properties or {}
            found.append(
                Read(
                    context.offset,
                    bytes(message.body),
                    str(_text(message.properties.message_id)),
                    {_text(k): _text(v) for k, v in props.items()},
                )
            )

        consumer = Consumer(HOST, PORT, username="guest", password="guest")
        try:
            await consumer.subscribe(
                stream,
                take,
                decoder=amqp_decoder,
                offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                count = len(found)
                await asyncio.sleep(0.5)
                if len(found) >= expected and len(found) == count:
                    break
        finally:
            with contextlib.suppress(Exception):
                await consumer.close()
        return sorted(found, key=lambda r: r.offset)

    return asyncio.run(run())


def wait_for_streams(timeout: float = 60.0) -> None:
    """Wait until the broker takes stream-protocol logins again (after ``start_app``)."""

    async def up() -> bool:
        try:
            client = await _client()
        except Exception:
            return False
        await client.close()
        return True

    deadline = time.monotonic() + timeout
    while not asyncio.run(up()):
        if time.monotonic() > deadline:
            raise RuntimeError("RabbitMQ's stream protocol did not come back")
        time.sleep(0.2)
