"""A hostile stream server cannot crash the stream client with its replies: JSON nested deeper
than the interpreter can follow (which makes ``json.loads`` raise RecursionError), or not
JSON at all, is a :class:`~tidings.errors.ProtocolError` naming the server, over HTTP polling
and over the WebSocket push alike. The servers are real local sockets answering this way."""

from __future__ import annotations

import asyncio

import pytest
import websockets

from tidings.errors import ProtocolError
from tidings.streams.client import StreamClient, consume

pytestmark = pytest.mark.sockets

NESTED = "[" * 200_000


async def _http_server(body: str) -> tuple[asyncio.Server, int]:
    """An HTTP server answering every request with ``body`` as FTN3 JSON."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n")
             if line.lower().startswith(b"content-length:")),
            0,
        )  # fmt: skip
        await reader.readexactly(length)
        data = body.encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/futoin+json\r\n"
            + f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(
    ("body", "why"), [(NESTED, "nested too deeply"), ("{not json", "not JSON"), ("[1]", "object")]
)
def test_a_poll_answered_with_hostile_json_is_a_protocol_error(body: str, why: str) -> None:
    async def main() -> None:
        server, port = await _http_server(body)
        async with server, StreamClient(f"http://127.0.0.1:{port}/s", "u", "p") as client:
            with pytest.raises(ProtocolError, match=why) as raised:
                await client.register("C")
            assert f"127.0.0.1:{port}" in str(raised.value)
            # polling through consume meets it too, and ends with it (no retry can fix it)
            with pytest.raises(ProtocolError, match=why):
                await asyncio.wait_for(
                    consume(f"http://127.0.0.1:{port}/s", "u", "p", "C", _ignore, push=False),
                    30,
                )

    asyncio.run(main())


async def _ignore(event: object) -> None:
    raise AssertionError(f"no event was sent, yet {event!r} was handled")


def test_a_push_frame_of_hostile_json_is_a_protocol_error() -> None:
    async def main() -> None:
        async def hostile(ws: websockets.ServerConnection) -> None:
            await ws.recv()  # the consumer's first call
            await ws.send(NESTED)
            async for _ in ws:  # until the client closes
                pass

        async with websockets.serve(hostile, "127.0.0.1", 0, max_size=None) as server:
            port = next(iter(server.sockets)).getsockname()[1]
            with pytest.raises(ProtocolError, match="nested too deeply") as raised:
                await asyncio.wait_for(
                    consume(f"http://127.0.0.1:{port}/s", "u", "p", "C", _ignore), 30
                )
            assert f"ws://127.0.0.1:{port}/s" in str(raised.value)

    asyncio.run(main())
