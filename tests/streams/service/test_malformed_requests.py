"""A malformed request is the sender's mistake: answered with InvalidRequest, no traceback
logged, only one line per stream and minute however many come, and the WebSocket it came on
goes on serving (real sockets, a real server)."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
import websockets

from tests.support.stream_helpers import add_events, call, poll, serving, stream_server_config
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


def test_a_flood_of_deep_requests_is_logged_once_and_others_are_served(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30: 60 KB of nesting, bare or inside a request's parameters, 40 times without a
    login: each answered InvalidRequest, one log line for them all, a consumer's events
    untouched."""
    bare = b"[" * 30_000 + b"]" * 30_000
    inside = (
        b'{"f": "futoin.evt.poll:1.1:pollEvents", "p": {"component": "OK", "want": ' + bare + b"}}"
    )
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "OK"})
            ids = await add_events(server.url, 2)
            async with httpx.AsyncClient() as client:
                for index in range(40):
                    response = await client.post(server.url, content=inside if index % 2 else bare)
                    assert response.json() == {
                        "e": "InvalidRequest",
                        "edesc": "the message is nested too deeply",
                    }
            reply = await poll(server.url, "OK")
            assert [int(event["id"]) for event in reply["r"]] == ids

    with caplog.at_level(logging.INFO):
        run(scenario())
    logged = [r for r in caplog.records if "request refused: InvalidRequest" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
