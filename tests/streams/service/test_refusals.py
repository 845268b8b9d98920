"""A cheap log flood refused (issue 30): JSON nested deeper than the interpreter's stack,
sent without login to a stream's HTTP and WebSocket endpoints, is ``InvalidRequest`` (not
``InternalError``), logged once per cause instead of a traceback per request, and everyone
else goes on being served. Real sockets, a real server in this process."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
import websockets

from tests.support.stream_helpers import add_events, call, poll, serving, stream_server_config
from tests.support.waiting import run

pytestmark = pytest.mark.sockets

#: 60 KB of nesting, as the issue sent: far deeper than Python's recursion limit.
DEEP = b"[" * 30_000 + b"]" * 30_000
DEEP_IN_A_REQUEST = (
    b'{"f": "futoin.evt.poll:1.1:pollEvents", "p": {"component": "OK", "want": '
    + b"[" * 30_000
    + b"]" * 30_000
    + b"}}"
)
FLOOD = 40


def test_deep_json_is_an_invalid_request_logged_once_and_others_are_served(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "OK"})
            ids = await add_events(server.url, 2)
            async with httpx.AsyncClient() as client:
                for index in range(FLOOD):
                    body = DEEP if index % 2 else DEEP_IN_A_REQUEST
                    response = await client.post(server.url, content=body)
                    assert response.status_code == 200
                    assert response.json() == {
                        "e": "InvalidRequest",
                        "edesc": "the message is nested too deeply",
                    }
            async with websockets.connect(server.ws_url, max_size=None) as ws:
                for body in (DEEP, DEEP_IN_A_REQUEST):
                    await ws.send(body)
                    assert json.loads(await ws.recv())["e"] == "InvalidRequest"
                # The same connection goes on: a request after the refused ones is answered.
                await ws.send(json.dumps({"f": "futoin.ping:1.0:ping", "p": {"echo": 5}}))
                assert json.loads(await ws.recv())["r"] == {"echo": 5}
            reply = await poll(server.url, "OK")
            assert [int(event["id"]) for event in reply["r"]] == ids

    with caplog.at_level(logging.INFO):
        run(scenario())
    refused = [r for r in caplog.records if "request refused: InvalidRequest" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in refused]  # once per cause, not 42 times
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert not [r for r in caplog.records if r.exc_info]  # no traceback for a peer's input


def test_failed_logins_are_logged_once_per_stream_not_per_attempt(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            for index in range(10):
                reply = await call(
                    server.url,
                    "futoin.evt.poll:1.1:pollEvents",
                    {"component": "OK"},
                    sec=f"ftn18:wrong-{index}",
                )
                assert reply["e"] == "SecurityError"

    with caplog.at_level(logging.INFO):
        run(scenario())
    refused = [r.getMessage() for r in caplog.records if "request refused" in r.getMessage()]
    assert refused == ["stream s: request refused: SecurityError: Basic Auth Verification Failed"]
    assert not [r for r in caplog.records if "wrong-" in r.getMessage()]  # no password logged
