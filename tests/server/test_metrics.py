"""The event server's own /metrics: two real servers in sync on free ports, the real
hat-event 0.8.5 client registers, queries and subscribes, and a GET over a real socket shows
the counts and labels; a bad metrics port is a configuration error."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import hat.event.common as hat
import hat.event.eventer as hat_eventer
import pytest

from bench.harness.processes import free_port, local_address
from tests.support.waiting import run
from tidings.config.server import load_server_config
from tidings.errors import ConfigError
from tidings.server.runner import RunningServer

pytestmark = pytest.mark.sockets


def _config(tmp_path: Path, server_id: int, ports: dict[str, int], **extra: object):
    return load_server_config(
        {
            "type": "event",
            "backend": {"module": "tidings.server.backends.sqlite", "db_path": f"e{server_id}.db"},
            "engine": {"server_id": server_id, "modules": []},
            "eventer_server": {"address": local_address(ports["eventer"])},
            **extra,
        },
        tmp_path,
    )


async def _scrape(port: int) -> dict[str, float]:
    """Every sample of ``http://127.0.0.1:port/metrics``, as ``name{labels}`` -> value."""

    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert reply.status == 200
            return reply.read().decode()

    text = await asyncio.to_thread(get)
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


async def _until(predicate, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


def test_server_metrics_count_what_clients_and_peers_do(tmp_path: Path) -> None:
    a_ports = {"eventer": free_port(), "syncer": free_port(), "metrics": free_port()}
    b_ports = {"eventer": free_port(), "metrics": free_port()}
    a = _config(
        tmp_path,
        1,
        a_ports,
        syncer_server={"address": local_address(a_ports["syncer"])},
        metrics={"port": a_ports["metrics"]},
    )
    b = _config(
        tmp_path,
        2,
        b_ports,
        syncer_peers=[{"server_id": 1, "address": local_address(a_ports["syncer"])}],
        metrics={"port": b_ports["metrics"], "address": "127.0.0.1"},
    )

    async def main() -> None:
        server_a = await RunningServer.start(a)
        server_b = None
        try:
            before = await _scrape(a_ports["metrics"])
            client = await hat_eventer.connect(local_address(a_ports["eventer"]), [("m", "*")])
            try:
                events = [
                    hat.RegisterEvent(
                        event_type=("m", str(i)),
                        source_timestamp=None,
                        payload=hat.EventPayload(hat.EventPayloadType.JSON, i),
                    )
                    for i in range(3)
                ]
                assert all(await client.register_with_response(events))
                assert len(await client.receive()) == 3  # one notification
                await client.query(hat.QueryData(event_types=[("m", "*")]))
                after = await _scrape(a_ports["metrics"])
            finally:
                await client.async_close()

            def grew(name: str) -> float:
                return after[name] - before.get(name, 0)

            # 3 events + the client's CONNECTED event, all registered here
            assert grew('tidings_server_events_registered_total{source="local"}') == 4
            assert grew('tidings_server_events_registered_total{source="syncer"}') == 0
            assert grew("tidings_server_register_requests_total") == 1
            assert grew("tidings_server_queries_total") == 1
            assert grew("tidings_server_notifications_total") == 1
            assert after["tidings_server_eventer_clients"] == 1
            assert before["tidings_server_eventer_clients"] == 0

            server_b = await RunningServer.start(b)  # now: its syncing registers on A too

            async def b_caught_up() -> bool:
                got = await _scrape(b_ports["metrics"])
                return (
                    got['tidings_server_syncer_peer_synced{peer="1"}'] == 1
                    and got['tidings_server_events_registered_total{source="syncer"}']
                    >= after['tidings_server_events_registered_total{source="local"}']
                )

            await _until(b_caught_up)
            seen_by_b = await _scrape(b_ports["metrics"])
            assert seen_by_b['tidings_server_syncer_peer_connected{peer="1"}'] == 1
            seen_by_a = await _scrape(a_ports["metrics"])
            assert seen_by_a['tidings_server_syncer_clients{synced="true"}'] == 1
        finally:
            if server_b is not None:
                await server_b.aclose()
            await server_a.aclose()
        with pytest.raises(OSError):  # the endpoint stopped with its server
            await _scrape(a_ports["metrics"])

    run(main())


def test_bad_metrics_port_is_a_configuration_error(tmp_path: Path) -> None:
    ports = {"eventer": free_port()}
    with pytest.raises(ConfigError, match=r"metrics\.port"):
        _config(tmp_path, 1, ports, metrics={"port": 70000})
    with pytest.raises(ConfigError, match=r"metrics\.port"):
        _config(tmp_path, 1, ports, metrics={"address": "127.0.0.1"})
    taken = free_port()
    config = _config(tmp_path, 1, ports, metrics={"port": taken})

    async def main() -> None:
        blocker = await asyncio.start_server(lambda r, w: None, "127.0.0.1", taken)
        try:
            with pytest.raises(ConfigError, match=f"metrics: cannot serve on 127.0.0.1:{taken}"):
                await RunningServer.start(config)
        finally:
            blocker.close()
            await blocker.wait_closed()
        # nothing of the failed start is left listening: the same eventer port starts again
        server = await RunningServer.start(_config(tmp_path, 1, ports))
        await server.aclose()

    run(main())


def test_no_metrics_section_no_endpoint(tmp_path: Path) -> None:
    config = _config(tmp_path, 1, {"eventer": free_port()})
    assert config.metrics is None

    async def main() -> None:
        server = await RunningServer.start(config)
        try:
            assert server.metrics is None
        finally:
            await server.aclose()

    run(main())
