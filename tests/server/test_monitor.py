"""Redundancy through a real Hat Monitor Server (hat-monitor 0.7.2, the Monitor hat-event
0.8.5 uses): which group members become Syncer peers, and real processes syncing through it.

The process tests run a real ``hat.monitor.server``, real hat-event 0.8.5 servers and real
``tidings server`` processes on real sockets; nothing of the Monitor protocol is faked.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hat.monitor.common import BlessingReq, BlessingRes, ComponentInfo, json_schema_repo

from bench.harness.processes import ServerProcess, free_port, local_address, wait_for_port
from tests.support.waiting import run, wait_until
from tidings import client
from tidings.config.server import load_server_config, load_server_config_file
from tidings.events.model import StoredEvent
from tidings.events.query import QueryData
from tidings.server.monitor import component_data, find_peers

GROUP = "event"


def _info(cid: int, name: str, data: object, group: str = GROUP) -> ComponentInfo:
    return ComponentInfo(
        cid=cid,
        mid=0,
        name=name,
        group=group,
        data=data,
        rank=1,
        blessing_req=BlessingReq(token=None, timestamp=None),
        blessing_res=BlessingRes(token=None, ready=False),
    )


def _peer_data(server_id: object, port: int = 1, **extra: object) -> dict[str, object]:
    return {"server_id": server_id, "syncer_server_address": local_address(port), **extra}


def test_peers_are_group_members_with_a_syncer_and_our_token() -> None:
    own = _info(1, "me", _peer_data(1, syncer_token="t"))
    components = [
        own,
        _info(2, "good", _peer_data(2, 2, syncer_token="t")),
        _info(3, "other group", _peer_data(3, 3, syncer_token="t"), group="gateway"),
        _info(4, "no syncer", {"server_id": 4, "eventer_server_address": local_address(4)}),
        _info(5, "not an event server", None),
        _info(6, "wrong token", _peer_data(6, 6, syncer_token="x")),
        _info(7, "no token", _peer_data(7, 7)),
        _info(8, "own id", _peer_data(1, 8, syncer_token="t")),
        _info(9, "text id", _peer_data("9", 9, syncer_token="t")),
        _info(10, "bool id", _peer_data(True, 10, syncer_token="t")),
        _info(
            11,
            "bad address",
            {"server_id": 11, "syncer_server_address": "http://x", "syncer_token": "t"},
        ),
    ]
    peers, ignored = find_peers(components, own, GROUP, 1, "t")
    assert peers == {2: local_address(2)}
    reasons = {key[0]: reason for key, reason in ignored.items()}
    assert set(reasons) == {6, 7, 8, 9, 10, 11}
    assert "its syncer_token differs from ours" in reasons[6] and "'x'" not in reasons[6]
    assert "its syncer_token differs from ours" in reasons[7]
    assert "this server's own" in reasons[8]
    assert "not a positive 64-bit integer" in reasons[9] and "'9'" in reasons[9]
    assert "not a positive 64-bit integer" in reasons[10]
    assert "syncer_server_address" in reasons[11] and "'bad address'" in reasons[11]


def test_without_a_token_of_ours_any_token_is_a_peer() -> None:
    """hat-event 0.8.5's rule: the token is checked only when this server has one."""
    own = _info(1, "me", _peer_data(1))
    components = [
        own,
        _info(2, "a", _peer_data(2, 2, syncer_token="x")),
        _info(3, "b", _peer_data(3, 3)),
    ]
    peers, ignored = find_peers(components, own, GROUP, 1, None)
    assert peers == {2: local_address(2), 3: local_address(3)}
    assert ignored == {}


def test_component_data_is_what_hat_event_publishes() -> None:
    base = {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": "x.db"},
        "engine": {"server_id": 7, "modules": []},
        "eventer_server": {"address": local_address(11)},
        "monitor": {"name": "n", "group": GROUP, "monitor_address": local_address(10)},
    }
    assert component_data(load_server_config(base)) == {
        "server_id": 7,
        "eventer_server_address": local_address(11),
    }
    full = {**base, "syncer_server": {"address": local_address(12)}, "syncer_token": "t"}
    assert component_data(load_server_config(full)) == {
        "server_id": 7,
        "eventer_server_address": local_address(11),
        "syncer_server_address": local_address(12),
        "syncer_token": "t",
    }


# --- real processes ----------------------------------------------------------------------------


@pytest.fixture
def monitor(tmp_path: Path) -> Iterator[ServerProcess]:
    """A BLESS_ALL Monitor Server (every event server of the group serves clients)."""
    process = ServerProcess.hat_monitor(tmp_path / "monitor", free_port(), "BLESS_ALL")
    process.start(20)
    yield process
    process.stop()


def _member(monitor: ServerProcess, name: str) -> dict[str, str]:
    return {
        "name": name,
        "group": GROUP,
        "monitor_address": local_address(monitor.ports["monitor"]),
    }


def _ports() -> dict[str, int]:
    return {"eventer": free_port(), "syncer": free_port()}


def _serving(server: ServerProcess, timeout: float = 30) -> None:
    """Wait until the server's Eventer listens (the Monitor blessed it)."""
    assert server.proc is not None
    wait_for_port(server.port, timeout, process=server.proc, log=server.log_path)


async def _register(server: ServerProcess, origin: str, numbers: range) -> None:
    async with await client.connect(server.eventer, timeout=5) as connection:
        events = [client.json_event(("load", origin), {"n": n}) for n in numbers]
        results = await connection.register_with_response(events)
        assert all(result is not None for result in results)


async def _loads(server: ServerProcess) -> list[StoredEvent]:
    async with await client.connect(server.eventer, timeout=5) as connection:
        return await connection.query(QueryData(event_types=(("load", "*"),)))


def _held(server: ServerProcess) -> set[tuple[str, int, int]]:
    """(origin, n, server id) of every load event the server holds; each once."""
    events = run(_loads(server))
    held = [(e.type[1], json.loads(e.payload)["n"], e.id.server) for e in events]
    assert len(held) == len(set(held)), f"{server.workdir.name} holds an event twice"
    return set(held)


def _expected(origin: str, numbers: range, server_id: int) -> set[tuple[str, int, int]]:
    return {(origin, n, server_id) for n in numbers}


@pytest.mark.slow
@pytest.mark.sockets
def test_hat_event_and_tidings_sync_through_the_monitor(tmp_path: Path, monitor) -> None:
    """A hat-event 0.8.5 server and a tidings server of one group and token sync both ways;
    a third server with another token is ignored by both; the hat server killed and started
    again is followed: what either side registered meanwhile reaches the other. Last, the
    Monitor dies and the tidings server stops with the reason."""
    servers: list[ServerProcess] = []
    try:
        # Each server's ports are picked just before it starts: the others' outgoing
        # connections take ephemeral ports, and one may be a port picked too early.
        for make in (
            lambda: ServerProcess.hat_event(
                tmp_path / "hat", 1, _ports(), monitor=_member(monitor, "hat"), token="t"
            ),
            lambda: ServerProcess.tidings(
                tmp_path / "ours", 2, _ports(), token="t", monitor=_member(monitor, "ours")
            ),
            lambda: ServerProcess.tidings(
                tmp_path / "stranger", 3, _ports(), token="x", monitor=_member(monitor, "stranger")
            ),
        ):
            servers.append(make())
            servers[-1].start(30)
            _serving(servers[-1])
        hat, ours, stranger = servers
        run(_register(hat, "hat", range(0, 10)))
        run(_register(ours, "ours", range(0, 10)))
        run(_register(stranger, "stranger", range(0, 10)))
        both = _expected("hat", range(0, 10), 1) | _expected("ours", range(0, 10), 2)
        for server in (hat, ours):
            wait_until(
                lambda server=server: _held(server) == both,
                30,
                interval=0.3,
                explain=lambda server=server: (
                    f"{server.workdir.name}: {sorted(_held(server) ^ both)[:5]}"
                ),
            )
        assert _held(stranger) == _expected("stranger", range(0, 10), 3)
        assert "not syncing with component 'stranger'" in ours.log_path.read_text()
        assert "its syncer_token differs from ours" in ours.log_path.read_text()

        hat.kill()
        wait_until(
            lambda: "peer server 1 left" in ours.log_path.read_text(),
            30,
            explain=lambda: ours.log_tail(),
        )
        run(_register(ours, "ours", range(10, 20)))
        hat.start(30)
        _serving(hat)
        run(_register(hat, "hat", range(10, 20)))
        # hat's lmdb backend flushes every second: what it acknowledged just before the
        # kill may be gone from it; tidings holds it from the sync and hands it back.
        both = _expected("hat", range(0, 20), 1) | _expected("ours", range(0, 20), 2)
        for server in (hat, ours):
            wait_until(
                lambda server=server: _held(server) >= both,
                60,
                interval=0.5,
                explain=lambda server=server: (
                    f"{server.workdir.name} lacks {sorted(both - _held(server))[:5]}"
                ),
            )
            assert _held(server) == both
        assert _held(stranger) == _expected("stranger", range(0, 10), 3)

        # Without its Monitor a server stops, saying why (as hat-event's does).
        monitor.kill()
        assert ours.proc is not None
        assert ours.proc.wait(30) == 2
        assert "the connection to the Monitor Server at" in ours.log_path.read_text()
    finally:
        for server in servers:
            server.stop()


@pytest.mark.slow
@pytest.mark.sockets
def test_bless_one_serves_from_one_server_and_fails_over(tmp_path: Path) -> None:
    """With BLESS_ONE, one server of the group serves clients while the other only syncs;
    when the serving one dies, the other is blessed, registers STARTED, opens its Eventer and
    holds what was registered on the first."""
    monitor = ServerProcess.hat_monitor(tmp_path / "monitor", free_port(), "BLESS_ONE")
    monitor.start(20)
    servers: list[ServerProcess] = [monitor]
    try:
        for server_id, name in ((1, "a"), (2, "b")):
            member = _member(monitor, name)
            servers.append(
                ServerProcess.tidings(
                    tmp_path / name, server_id, _ports(), token="t", monitor=member
                )
            )
            servers[-1].start(30)
        a, b = servers[1:]

        def serving() -> list[ServerProcess]:
            found = []
            for server in (a, b):
                try:
                    wait_for_port(server.port, 0.2)
                    found.append(server)
                except RuntimeError:
                    pass
            return found

        wait_until(lambda: len(serving()) == 1, 30, explain=lambda: a.log_tail() + b.log_tail())
        asyncio.run(asyncio.sleep(1))  # the Monitor settled: still exactly one serves
        [active] = serving()
        standby = b if active is a else a
        wait_until(lambda: "is synced" in active.log_path.read_text(), 30, explain=active.log_tail)
        run(_register(active, "load", range(0, 20)))
        assert "monitor blessed this server" not in standby.log_path.read_text()
        asyncio.run(asyncio.sleep(1))  # the standby's Syncer client stores the live events
        active.kill()
        _serving(standby, 30)
        assert "monitor blessed this server" in standby.log_path.read_text()
        active_id = 1 if active is a else 2
        assert _held(standby) == _expected("load", range(0, 20), active_id)

        async def engine_events() -> list[object]:
            async with await client.connect(standby.eventer, timeout=5) as connection:
                events = await connection.query(QueryData(event_types=(("event", "engine"),)))
            return [json.loads(e.payload) for e in events if e.id.server != active_id]

        assert run(engine_events()) == ["STARTED"]
    finally:
        for server in reversed(servers):
            server.stop()


def test_the_monitor_examples_are_valid_configurations() -> None:
    """examples/monitor/: hat-monitor's own schema accepts the Monitor's file, tidings loads
    both servers' files, and they form one group under one token."""
    folder = Path(__file__).resolve().parents[2] / "examples" / "monitor"
    monitor_conf = yaml.safe_load((folder / "monitor.yaml").read_text())
    json_schema_repo.validate("hat-monitor://main.yaml#", monitor_conf)
    servers = [load_server_config_file(folder / f"event-{name}.yaml") for name in "ab"]
    assert {s.monitor.monitor_address for s in servers if s.monitor} == {
        monitor_conf["server"]["address"]
    }
    assert {s.monitor.group for s in servers if s.monitor} == {GROUP}
    assert len({s.syncer_token for s in servers}) == 1
    assert len({s.engine.server_id for s in servers}) == 2
