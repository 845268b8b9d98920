"""A malformed request is the sender's mistake: answered with InvalidRequest, no traceback
logged, and the WebSocket it came on goes on serving (real sockets, a real server)."""

from __future__ import annotations

import json

import httpx
import websockets

from tests.support.stream_helpers import serving, stream_server_config
from tests.support.waiting import run


def test_deeply_nested_json_is_an_invalid_request_and_the_websocket_stays(tmp_path, caplog) -> None:
    """The issue's log flood: 40 KB of nested arrays, over HTTP and on a WebSocket."""
    nested = "[" * 20000 + "]" * 20000

    async def scenario() -> None:
        config = stream_server_config(f"sqlite:///{tmp_path}/a.db")
        async with serving(config) as server:
            async with httpx.AsyncClient() as client:
                reply = (await client.post(server.url, content=nested)).json()
            assert reply["e"] == "InvalidRequest" and "nested too deeply" in reply["edesc"]
            async with websockets.connect(server.ws_url) as ws:
                await ws.send(nested)
                assert json.loads(await ws.recv())["e"] == "InvalidRequest"
                await ws.send('{"f": "futoin.evt.poll:1.1:pollEvents", "p": {}, "rid": "C2"}')
                assert json.loads(await ws.recv())["rid"] == "C2"

    run(scenario())
    assert not [r for r in caplog.records if r.exc_info]
