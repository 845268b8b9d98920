"""A hostile intermediary cannot crash its subscribers' client: a hello or a later message of
JSON nested deeper than the interpreter can follow (``json.loads`` raises RecursionError),
or not JSON, is a :class:`~tidings.errors.ProtocolError` naming what was wrong; the client
closes the connection, and the subscriber's next call raises that error. The servers are
real local WebSocket servers answering this way."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest
import websockets

from tidings.errors import ProtocolError
from tidings.intermediary.client import IntermediaryClient

pytestmark = pytest.mark.sockets

NESTED = "[" * 200_000
HELLO = json.dumps({"op": "hello", "subscriber": 1})


async def _serving(
    handler: Callable[[websockets.ServerConnection], Awaitable[None]],
    check: Callable[[str], Awaitable[None]],
) -> None:
    async with websockets.serve(handler, "127.0.0.1", 0, max_size=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        await check(f"ws://127.0.0.1:{port}/")


async def _until_closed(ws: websockets.ServerConnection) -> None:
    async for _ in ws:
        pass


@pytest.mark.parametrize(("hello", "why"), [(NESTED, "nested too deeply"), ("[", "not JSON")])
def test_a_hostile_hello_is_a_protocol_error(hello: str, why: str) -> None:
    async def handler(ws: websockets.ServerConnection) -> None:
        await ws.send(hello)
        await _until_closed(ws)

    async def check(url: str) -> None:
        with pytest.raises(ProtocolError, match=why) as raised:
            await IntermediaryClient.connect(url, max_size=None)
        assert url in str(raised.value)

    asyncio.run(_serving(handler, check))


def test_a_hostile_message_closes_the_connection_and_the_next_call_says_why() -> None:
    async def handler(ws: websockets.ServerConnection) -> None:
        await ws.send(HELLO)
        await ws.recv()  # the subscription
        await ws.send(NESTED)
        await _until_closed(ws)

    async def check(url: str) -> None:
        client = await IntermediaryClient.connect(url, max_size=None)
        with pytest.raises(ProtocolError, match="nested too deeply"):
            await asyncio.wait_for(client.subscribe_events("k", [["a"]]), 30)
        with pytest.raises(ProtocolError, match="nested too deeply"):
            await client.message(30)
        assert client.close_code == 1002
        await client.close()

    asyncio.run(_serving(handler, check))
