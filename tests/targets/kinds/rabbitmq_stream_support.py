"""RabbitMQ streams on the shared broker (127.0.0.1:5552, guest/guest) for the
``rabbitmq_stream`` target's tests and benchmark: streams made and deleted with rstream's
client, and read back from the first offset with rstream's own ``Consumer``."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
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


def delete_streams(prefix: str) -> None:
    """Delete every stream whose name starts with ``prefix`` (one connection for all)."""
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "name"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()

    async def run() -> None:
        client = await _client()
        try:
            for name in listed:
                if name.startswith(prefix):
                    await client.delete_stream(name)
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


class StallingProxy:
    """A TCP relay to the broker's stream port that can stop reading from its clients: what
    a client sends then piles up in the sockets (the client's writes block), as when the
    broker stops reading a connection (a resource alarm) or a link stalls. ``resume()`` lets
    it flow again: whatever reached the proxy is forwarded, late. Real sockets both ways; the
    stall is the fault the broker cannot be made to produce here on demand."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"rabbitmq-stream://127.0.0.1:{self.port}/"

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            # a small receive buffer: a stalled client's writes block after a few MB
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            upstream = socket.create_connection((HOST, PORT))
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, stalls: bool) -> None:
        try:
            while True:
                if stalls:
                    self._flowing.wait()
                if self._closed:
                    return
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
