"""tidings' asyncio client of the event server (:mod:`tidings.client`): what it refuses before
sending, how it fails once the server is gone, its JSON helpers. Against a real Eventer server
over real sockets on a real SQLite store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.server_helpers import running
from tests.support.waiting import run
from tidings.client import Client, connect, json_event, json_value
from tidings.errors import ClientError, ConnectionClosed
from tidings.events.model import NewEvent, PayloadKind

pytestmark = pytest.mark.sockets


def test_invalid_subscription_is_refused_by_the_client(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv, await connect(srv.address) as client:
            with pytest.raises(ClientError, match="only as the last segment"):
                await client.subscribe([("*", "a")])
            assert client.is_open

    run(main())


def test_client_refuses_unsendable_events(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv, await connect(srv.address) as client:
            with pytest.raises(ClientError, match="payload and payload_kind"):
                await client.register([NewEvent(("a",), b"x")])
            with pytest.raises(ClientError, match="cannot encode"):
                await client.register([NewEvent(("a",), b"\xff", PayloadKind.JSON)])
            with pytest.raises(ClientError, match="expected a NewEvent"):
                await client.register_with_response(["a"])  # type: ignore[list-item]
            assert await client.register_with_response([NewEvent(("a",))]) != [None]

    run(main())


def test_client_after_the_server_is_gone(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv:
            client: Client = await connect(srv.address, request_timeout=5)
            await srv.server.aclose()
            with pytest.raises(ConnectionClosed):
                await client.receive()
            with pytest.raises(ConnectionClosed):
                await client.query()
            await client.aclose()
            assert not client.is_open

    run(main())


def test_json_helpers() -> None:
    event = json_event(["a", "b"], {"k": [1, "ü"]}, 7, outbox_event_id="o")  # type: ignore[arg-type]
    assert event == NewEvent(
        ("a", "b"), json.dumps({"k": [1, "ü"]}).encode(), PayloadKind.JSON, 7, "o"
    )
    assert json_value(event) == {"k": [1, "ü"]}
    with pytest.raises(ClientError, match="no JSON payload"):
        json_value(NewEvent(("a",), b"x", PayloadKind.BINARY))
