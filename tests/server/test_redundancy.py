"""Two tidings event servers synced through the Syncer, one SIGKILLed under load.

Both run as real ``tidings server`` processes on real sockets with their own SQLite files;
the load comes through the Eventer protocol. After the killed server is restarted, both logs
must hold the same events (same ids, types, payloads, timestamps), each once, including
every event whose registration was acknowledged on either side.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench.harness.processes import ServerProcess, free_port, local_address
from tests.support.waiting import run, wait_until
from tidings import client
from tidings.events.model import StoredEvent
from tidings.events.query import QueryData

pytestmark = [pytest.mark.slow, pytest.mark.sockets]

TOKEN = "test-pair"


@pytest.fixture
def pair(tmp_path: Path):
    ports = {name: {"eventer": free_port(), "syncer": free_port()} for name in "ab"}
    syncers = {name: local_address(port["syncer"]) for name, port in ports.items()}
    a = ServerProcess.tidings(tmp_path / "a", 1, ports["a"], [(2, syncers["b"])], TOKEN)
    b = ServerProcess.tidings(tmp_path / "b", 2, ports["b"], [(1, syncers["a"])], TOKEN)
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


class Writer:
    """Registers numbered events on one server; survives the server going away."""

    def __init__(self, server: ServerProcess, name: str) -> None:
        self.server = server
        self.name = name
        self.acked: set[int] = set()
        self.next = 0

    async def run(self, stop: asyncio.Event) -> None:
        connection: client.Client | None = None
        while not stop.is_set():
            try:
                if connection is None:
                    connection = await client.connect(self.server.eventer, timeout=1)
                batch = list(range(self.next, self.next + 5))
                self.next += 5
                events = [client.json_event(("load", self.name), {"n": n}) for n in batch]
                results = await asyncio.wait_for(connection.register_with_response(events), 5)
                assert all(result is not None for result in results)
                self.acked.update(batch)
            except (OSError, TimeoutError, client.ConnectionClosed):
                connection = None
                await asyncio.sleep(0.1)
        if connection is not None:
            await connection.aclose()


async def _load_events(server: ServerProcess) -> list[StoredEvent]:
    async with await client.connect(server.eventer) as connection:
        return await connection.query(QueryData(event_types=(("load", "*"),)))


def _key(event: StoredEvent) -> tuple:
    return (event.id, event.type, event.payload, event.timestamp_us, event.source_timestamp_us)


@pytest.mark.slow
def test_two_servers_converge_after_one_is_killed_under_load(pair) -> None:
    a, b = pair

    async def scenario() -> tuple[Writer, Writer]:
        writers = [Writer(a, "a"), Writer(b, "b")]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(w.run(stop)) for w in writers]
        await asyncio.sleep(2)
        b.kill()
        acked_before_kill = set(writers[1].acked)
        await asyncio.sleep(2)
        await asyncio.to_thread(b.start)
        await asyncio.sleep(2)
        stop.set()
        await asyncio.gather(*tasks)
        assert acked_before_kill, "server b took no load before it was killed"
        return writers[0], writers[1]

    writer_a, writer_b = run(scenario(), 60)

    def keys(server: ServerProcess) -> set[tuple]:
        return {_key(e) for e in run(_load_events(server))}

    wait_until(
        lambda: keys(a) == keys(b),
        60,
        interval=0.5,
        explain=lambda: f"only one side holds {list(keys(a) ^ keys(b))[:5]}",
    )
    on_a, on_b = run(_load_events(a)), run(_load_events(b))
    assert {_key(e) for e in on_a} == {_key(e) for e in on_b}
    for events in (on_a, on_b):
        ids = [e.id for e in events]
        assert len(ids) == len(set(ids)), "an event is stored twice"
        numbers = {
            name: [json.loads(e.payload)["n"] for e in events if e.type == ("load", name)]
            for name in "ab"
        }
        assert writer_a.acked <= set(numbers["a"])
        assert writer_b.acked <= set(numbers["b"])
        for name in "ab":
            assert len(numbers[name]) == len(set(numbers[name])), "a registration is doubled"
    # Events of each origin keep their origin's server id.
    assert {e.id.server for e in on_a if e.type == ("load", "a")} == {1}
    assert {e.id.server for e in on_a if e.type == ("load", "b")} == {2}
