"""Stream retention: events leave the store only once every registered consumer of every
stream carrying them has acknowledged them; the latest event of each type stays; consumers
can be inspected and unregistered from the command line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
import yaml

from tests.support.stream_helpers import add_events, call, poll, serving, stream_server_config
from tests.support.waiting import run, until
from tidings.server.store import EventStore

pytestmark = pytest.mark.sockets

RETAIN = {"enabled": True, "min_age": "0s", "every": "50ms"}


def _stored(url: str) -> set[int]:
    store = EventStore(url)
    try:
        return {event.position for event in store.read(0, 100_000)}
    finally:
        store.close()


def test_retention_waits_for_every_consumer_and_keeps_the_latest_of_each_type(
    database_url: str,
) -> None:
    config = stream_server_config(database_url, secure_channel=True, retention=RETAIN)

    async def scenario() -> None:
        async with serving(config) as server:
            for component in ("A", "B"):
                await call(
                    server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": component}
                )
            orders = await add_events(server.url, 10, "ORDER")
            pays = await add_events(server.url, 2, "PAY")
            await poll(server.url, "A", pays[-1])  # A has read everything
            await poll(server.url, "B", orders[4])  # B only the first five orders
            await until(lambda: not set(orders[:5]) & _stored(database_url), 10)
            left = _stored(database_url)
            assert set(orders[5:]) | set(pays) <= left  # B has not read them
            await poll(server.url, "B", pays[-1])
            await until(lambda: orders[8] not in _stored(database_url), 10)
            left = _stored(database_url)
            assert orders[-1] in left and pays[-1] in left  # the latest of each type
            assert not (set(orders[:-1]) | set(pays[:-1])) & left
            # Unread by the consumer that registers now: it starts after what is gone.
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "C"})
            reply = await poll(server.url, "C")
            assert [int(e["id"]) for e in reply["r"]] == [orders[-1], pays[-1]]

    run(scenario(), timeout=60)


def test_retention_keeps_what_another_stream_still_needs_and_nothing_without_consumers(
    tmp_path,
) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    config = stream_server_config(url, secure_channel=True, retention=RETAIN)
    other = config["streams"][0] | {
        "name": "audit",
        "path": "/audit",
        "retention": {"enabled": False},
    }
    config["streams"].append(other)

    async def scenario() -> None:
        async with serving(config) as server:
            ids = await add_events(server.url, 5)
            await asyncio.sleep(0.3)
            assert set(ids) <= _stored(url)  # no consumer yet: nothing may go
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "A"})
            await poll(server.url, "A", ids[-1])
            await asyncio.sleep(0.3)
            assert set(ids) <= _stored(url)  # the audit stream keeps everything

    run(scenario(), timeout=60)


def test_streams_status_and_unregister_on_the_command_line(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    config = stream_server_config(url, secure_channel=True, retention=RETAIN)
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(config))

    async def scenario() -> list[int]:
        async with serving(config) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "FAST"})
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "DEAD"})
            ids = await add_events(server.url, 4)
            await poll(server.url, "FAST", ids[-1])
            return ids

    ids = run(scenario(), timeout=60)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tidings.cli", "streams", *args, "--conf", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    status = cli("status", "--json")
    assert status.returncode == 0, status.stderr
    [stream] = json.loads(status.stdout)
    assert (stream["first_id"], stream["last_id"]) == (ids[0], ids[-1])
    by_name = {c["component"]: c for c in stream["consumers"]}
    # Past the stream's last event: its position moved over the server's consumer events.
    assert by_name["FAST"]["behind"] == 0 and by_name["FAST"]["position"] > ids[-1]
    assert by_name["DEAD"]["behind"] == 4 and by_name["DEAD"]["acked_at"] is None
    assert "DEAD at 0, 4 behind" in cli("status").stdout
    assert cli("unregister", "s", "ftn18", "DEAD").returncode == 0
    again = cli("unregister", "s", "ftn18", "DEAD")
    assert again.returncode == 1 and "no consumer" in again.stderr
    unknown = cli("unregister", "nope", "ftn18", "X")
    assert unknown.returncode == 2
    assert unknown.stderr == "error: no stream 'nope' in the configuration (defined: s)\n"
    for component in ("bad-name!", "LIVE"):  # refused, not answered "no consumer"
        malformed = cli("unregister", "s", "ftn18", component)
        assert malformed.returncode == 2
        assert malformed.stderr == (
            f"error: {component!r} is not a consumer component (1-16 of A-Z a-z 0-9 _; LIVE "
            "consumers are never registered)\n"
        )

    async def after() -> None:
        async with serving(config):
            await until(lambda: _stored(url) & set(ids) == {ids[-1]}, 10)  # the latest stays

    run(after(), timeout=60)
