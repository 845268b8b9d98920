"""Large frames. One over ``max_frame_bytes``: a reply to one of our requests fails that
request alone with :class:`ReplyTooLarge` (naming the size and the limit) and the connection
goes on; any other oversize frame closes the connection, and the requests still waiting
learn why. A peer still sending a large frame is not taken for gone by the pinger, though
its pong waits behind the frame. On a socket pair, the peer's frames written from the
specification."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.server_helpers import (
    event_to_sbs,
    raw_message,
    read_raw_frame,
    socket_pair,
    warnings_of,
)
from tests.support.waiting import run
from tidings.errors import ConnectionClosed, ReplyTooLarge
from tidings.events.model import EventId, PayloadKind, StoredEvent
from tidings.events.query import QueryData
from tidings.wire import codec
from tidings.wire.chatter import Connection, Message

LIMIT = 1024
#: A query reply of about 3 KB, three times the limit.
BIG_REPLY = [
    event_to_sbs(
        StoredEvent(0, EventId(1, 1, n), ("a",), 0, None, b"x" * 100, PayloadKind.BINARY, None)
    )
    for n in range(1, 31)
]


async def _ask(connection: Connection, raw_reader: asyncio.StreamReader) -> tuple[Any, int]:
    """A query sent on ``connection``: the task awaiting its reply, and its conversation's
    first id as the peer read it."""
    asking = asyncio.ensure_future(
        connection.request("HatEventer", "MsgQueryReq", codec.query_to_sbs(QueryData()))
    )
    envelope, _ = await read_raw_frame(raw_reader)
    return asking, envelope["id"]


def _reply(first: int, value: Any, message_id: int) -> bytes:
    return raw_message(
        "HatEventer", "MsgQueryRes", value, message_id=message_id, first=first, owner=False
    )


def test_an_oversize_reply_fails_its_request_and_the_connection_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> Message:
        connection, raw_reader, raw_writer = await socket_pair(max_frame_bytes=LIMIT)
        asking, first = await _ask(connection, raw_reader)
        big = _reply(first, BIG_REPLY, message_id=1)
        assert len(big) > 3 * LIMIT
        raw_writer.write(big)
        with pytest.raises(ReplyTooLarge) as refused:
            await asking
        message = str(refused.value)
        assert "HatEventer.MsgQueryRes of" in message
        assert f"exceeds max_frame_bytes ({LIMIT} bytes)" in message
        assert connection.is_open
        # The bytes after the dropped reply are read as the next frame.
        asking, first = await _ask(connection, raw_reader)
        raw_writer.write(_reply(first, [], message_id=2))
        reply: Message = await asking
        assert connection.is_open
        await connection.aclose()
        return reply

    assert run(main()).data == []
    [line] = warnings_of(caplog)
    assert f"exceeds max_frame_bytes ({LIMIT} bytes)" in line


@pytest.mark.parametrize("case", ["not a reply", "a reply to no request"])
def test_any_other_oversize_frame_closes_and_waiting_requests_learn_why(case: str) -> None:
    async def main() -> str:
        connection, raw_reader, raw_writer = await socket_pair(max_frame_bytes=LIMIT)
        asking, first = await _ask(connection, raw_reader)
        if case == "not a reply":
            frame = raw_message("HatEventer", "MsgNotify", BIG_REPLY, message_id=1)
        else:
            frame = _reply(first + 10, BIG_REPLY, message_id=1)
        raw_writer.write(frame)
        with pytest.raises(ConnectionClosed) as closed:
            await asking
        await connection.aclose()
        return str(closed.value)

    message = run(main())
    assert f"exceeds the limit of {LIMIT} bytes (max_frame_bytes)" in message


def test_a_peer_sending_a_large_frame_for_several_ping_intervals_is_not_gone() -> None:
    """The frame (~1 MB) arrives in pieces over about four ping intervals; the peer answers
    no ping meanwhile (a hat peer's pong would wait behind the frame)."""

    async def main() -> tuple[Message, bool]:
        connection, _raw_reader, raw_writer = await socket_pair(ping_interval=0.2)
        frame = raw_message("HatEventer", "MsgNotify", BIG_REPLY * 300)
        piece = len(frame) // 16 + 1
        for start in range(0, len(frame), piece):
            raw_writer.write(frame[start : start + piece])
            await asyncio.sleep(0.05)
        message = await connection.receive()
        still_open = connection.is_open
        await connection.aclose()
        return message, still_open

    message, still_open = run(main())
    assert len(message.data) == len(BIG_REPLY) * 300
    assert still_open
