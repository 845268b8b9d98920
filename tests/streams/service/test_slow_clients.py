"""Connections that never finish a request head (idle sockets, slowloris) are closed and
counted in the stream's metrics; a client that sends its requests goes on being served.
Real sockets against a real server; the head timeout is shortened so the test is quick."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import websockets

from bench.harness.sockets import SLOW_HEAD, closed_within, trickle
from tests.support.stream_helpers import poll, serving, stream_server_config
from tests.support.waiting import run
from tidings.streams.service import slow_clients


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection (well after the shortened timeout)."""
    return await closed_within(reader, 30)


def test_idle_and_slow_heads_are_closed_and_counted(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(slow_clients, "REQUEST_HEAD_TIMEOUT_S", 0.5)

    async def scenario() -> None:
        config = stream_server_config(f"sqlite:///{tmp_path}/a.db", metrics=True)
        async with serving(config) as server:
            port = server.config.streams[0].port
            idle_reader, idle = await asyncio.open_connection("127.0.0.1", port)
            slow_reader, slow = await asyncio.open_connection("127.0.0.1", port)
            slow.write(SLOW_HEAD)
            trickling = asyncio.create_task(trickle([slow], 0.05, 30))
            assert await _closed_by_server(idle_reader)
            assert await _closed_by_server(slow_reader)
            slow.close()
            idle.close()
            trickling.cancel()
            # Others are served all along, a keep-alive client across several requests too.
            ping = json.dumps({"f": "futoin.ping:1.0:ping", "p": {"echo": 1}})
            async with httpx.AsyncClient() as client:
                for _ in range(3):
                    reply = await client.post(server.url, content=ping)
                    assert reply.json() == {"r": {"echo": 1}}
                reply = await client.get(server.metrics_url)
            counted = re.search(
                r'tidings_stream_refusals_total\{[^}]*reason="slow_request_head"[^}]*\} (\S+)',
                reply.text,
            )
            assert counted is not None and float(counted.group(1)) == 2.0
            assert await poll(server.url, "OK") is not None

    run(scenario())


def test_a_websocket_is_not_timed_once_upgraded(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(slow_clients, "REQUEST_HEAD_TIMEOUT_S", 0.2)

    async def scenario() -> None:
        config = stream_server_config(f"sqlite:///{tmp_path}/a.db")
        async with serving(config) as server, websockets.connect(server.ws_url) as ws:
            await asyncio.sleep(1)  # five head timeouts: the WebSocket stays open
            await ws.send('{"f": "futoin.evt.poll:1.1:pollEvents", "p": {}, "rid": "C1"}')
            assert json.loads(await ws.recv())["rid"] == "C1"

    run(scenario())
