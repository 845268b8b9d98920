"""The worst case of a failover between two synced servers: exactly once across the pair.

Server A stores outbox event E and its Syncer copies E to server B, then A dies before it
answers the relay. The relay sends E again, now to B. Afterwards E is stored once in each
store, notified once to B's subscribers and streamed once by B's FTN18 stream.

Both servers are real ``tidings server`` processes on real sockets, A on a SQLite file, B on
SQLite or PostgreSQL (B is the one that meets E twice). The relay's side is the tidings
client with the outbox-id extension, as the relay's ``event_server`` target sends.

**Injected fault.** A dying in the instant between storing E and answering cannot be made
to happen on demand by a real server: the answer leaves microseconds after the store. So
the relay talks to A through a proxy (in this test) that forwards the relay's bytes to A
and drops A's answers; once B holds E the test SIGKILLs A for real, and the proxy then
closes the relay's connection, as A's death would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.harness.processes import ServerProcess, free_port, local_address
from tests.support.stream_helpers import backend_of, call, poll, stream_server_config
from tests.support.waiting import run, until
from tidings import client
from tidings.events.model import StoredEvent
from tidings.events.query import QueryData

pytestmark = [pytest.mark.slow, pytest.mark.sockets, pytest.mark.timeout(180)]

TOKEN = "test-outbox-failover"
ORDERS = ("orders", "created")


def order(outbox_id: str) -> client.NewEvent:
    return client.json_event(ORDERS, {"id": outbox_id}, outbox_event_id=outbox_id)


def with_stream(server: ServerProcess) -> str:
    """Add an FTN18 stream of ``orders`` events to ``server``'s configuration; its URL."""
    config: dict[str, Any] = yaml.safe_load(server.config.read_text())
    extra = stream_server_config("sqlite:///unused", secure_channel=True)
    config["stream_users"] = extra["stream_users"]
    config["streams"] = extra["streams"]
    server.config.write_text(yaml.safe_dump(config, sort_keys=False))
    stream = extra["streams"][0]
    return f"http://127.0.0.1:{stream['port']}{stream['path']}"


class AnswerDroppingProxy:
    """Forwards a client's bytes to ``target`` and drops every byte coming back; closes the
    client's side when the target's side ends (the injected fault, see the module)."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return local_address(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)

        async def forward() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        task = asyncio.create_task(forward())
        self._tasks.add(task)
        with contextlib.suppress(OSError):
            while await up_reader.read(65536):
                pass  # the answers A would give: dropped
        task.cancel()
        writer.close()
        up_writer.close()

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            self._server.close()


async def orders_at(server: ServerProcess) -> list[StoredEvent]:
    async with await client.connect(server.eventer) as connection:
        return await connection.query(QueryData(event_types=(ORDERS,)))


async def settled_orders(server: ServerProcess, timeout: float = 10.0) -> Counter[str]:
    """How often each ``orders`` event is stored at ``server``, once both E and F are there
    (or at ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while set(stored := ids_of(await orders_at(server))) != {"E", "F"}:
        if loop.time() > deadline:
            break
        await asyncio.sleep(0.05)
    return stored


def ids_of(events: list[StoredEvent]) -> Counter[str]:
    return Counter(client.json_value(e)["id"] for e in events)


@pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)
def test_a_resent_event_is_stored_notified_and_streamed_once_after_its_server_died(
    tmp_path: Path, database_url: str
) -> None:
    ports = {name: {"eventer": free_port(), "syncer": free_port()} for name in "ab"}
    syncers = {name: local_address(port["syncer"]) for name, port in ports.items()}
    a = ServerProcess.tidings(tmp_path / "a", 1, ports["a"], [(2, syncers["b"])], TOKEN)
    b = ServerProcess.tidings(
        tmp_path / "b", 2, ports["b"], [(1, syncers["a"])], TOKEN, backend=backend_of(database_url)
    )
    stream_url = with_stream(b)

    async def scenario() -> None:
        notified: Counter[str] = Counter()
        subscriber = await client.connect(b.eventer)
        await subscriber.subscribe([("orders", "*")])

        async def count() -> None:
            while True:
                notified.update(ids_of(await subscriber.receive()))

        counting = asyncio.create_task(count())
        proxy = AnswerDroppingProxy(ports["a"]["eventer"])
        relay_to_a = await client.connect(await proxy.start(), timeout=5)
        sending = asyncio.create_task(relay_to_a.register_outbox([order("E")]))
        # A stored E and its Syncer copied it to B, but A's answer never reached the relay.
        await until(lambda: notified["E"] == 1, 20)
        assert not sending.done()
        a.kill()
        with pytest.raises(client.ConnectionClosed):
            await asyncio.wait_for(sending, 10)
        await relay_to_a.aclose()
        await proxy.aclose()

        # The relay sends E again, to B: answered with the event B holds, A's own.
        async with await client.connect(b.eventer) as relay_to_b:
            (answer,) = await relay_to_b.register_outbox([order("E")])
            assert answer is not None and answer.id.server == 1

        # A comes back on its files and syncs with B; F shows that B's events reach it.
        await asyncio.to_thread(a.start)
        async with await client.connect(b.eventer) as relay_to_b:
            await relay_to_b.register_outbox([order("F")])
        for server in (a, b):
            assert await settled_orders(server) == Counter({"E": 1, "F": 1}), server.workdir
        await asyncio.sleep(0.5)  # nothing late
        assert notified == Counter({"E": 1, "F": 1})

        await call(stream_url, "futoin.evt.poll:1.1:registerConsumer", {"component": "C"})
        streamed = (await poll(stream_url, "C"))["r"]
        assert Counter(event["data"]["id"] for event in streamed) == Counter({"E": 1, "F": 1})

        counting.cancel()
        await subscriber.aclose()

    a.start()
    b.start()
    try:
        run(scenario(), timeout=120)
    finally:
        a.stop()
        b.stop()
