"""The Eventer server under hostile and careless clients (issue 8), over real sockets, with a
bystander: hat-event 0.8.5's own client registering and querying in a loop throughout.

Each test is a row of the issue's table: the hostile connection is closed (with its one log
line) or served, and the bystander's registrations and queries keep succeeding, before,
during and after. Sizes are smaller than the benchmark's (bench/server/hostile.py), but
above the thresholds that matter (the decode thread, the streamed reply, the lag bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import hat.event.common as hat
import hat.event.eventer as hat_eventer
import pytest

from tests.support.server_helpers import (
    raw_frame,
    raw_message,
    running,
    wait_peer_closed,
    warnings_of,
)
from tests.support.waiting import run, until
from tidings.client import connect
from tidings.config.server import DEFAULT_MAX_FRAME_BYTES
from tidings.events.model import NewEvent, PayloadKind
from tidings.events.query import QueryData
from tidings.server.eventer.query_replies import INLINE_REPLY_BYTES
from tidings.wire import codec

pytestmark = pytest.mark.sockets

#: Events of the big-query tests: 100-byte payloads, enough for a reply of ~1.4 MB (streamed:
#: over INLINE_REPLY_BYTES, and over the lag bound of 512 KiB the lag test sets).
BIG_EVENTS = 10_000
PAYLOAD = b"p" * 100


class Bystander:
    """A hat-event 0.8.5 client that registers one event and queries it back, in a loop,
    and counts its successful rounds; any failure is kept and fails the test."""

    def __init__(self, client: hat_eventer.Client) -> None:
        self.client = client
        self.rounds = 0
        self.failure: BaseException | None = None
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        try:
            while True:
                event = hat.RegisterEvent(
                    event_type=("bystander", str(self.rounds)),
                    source_timestamp=None,
                    payload=hat.EventPayload(type=hat.EventPayloadType.JSON, data=self.rounds),
                )
                [stored] = await self.client.register_with_response([event])
                assert stored is not None and stored.payload.data == self.rounds  # type: ignore[union-attr]
                found = await self.client.query(
                    hat.QueryData(event_types=[("bystander", "*")], max_results=1)
                )
                assert [e.event_id for e in found] == [stored.event_id]
                self.rounds += 1
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # kept for the test to report
            self.failure = exc

    async def rounds_later(self, more: int = 3) -> None:
        """Wait until the bystander has done ``more`` further rounds."""
        target = self.rounds + more
        await until(lambda: self.rounds >= target or self.failure is not None)
        assert self.failure is None, f"the bystander failed: {self.failure!r}"

    async def stop(self) -> int:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        assert self.failure is None, f"the bystander failed: {self.failure!r}"
        return self.rounds


@contextlib.asynccontextmanager
async def bystander_of(address: str) -> AsyncIterator[Bystander]:
    client = await hat_eventer.connect(address, [("bystander", "*")])
    bystander = Bystander(client)
    try:
        await bystander.rounds_later()
        yield bystander
        await bystander.rounds_later()
        await bystander.stop()
    finally:
        await client.async_close()


async def hostile_send(port: int, data: bytes) -> None:
    """Send ``data`` on a raw socket and wait until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    with contextlib.suppress(ConnectionError):
        writer.write(data)
        await writer.drain()
    await wait_peer_closed(reader, timeout=30)
    writer.close()


def lying_frame() -> bytes:
    """A well-framed register whose array declares 2^31 items (~30 bytes)."""
    return raw_frame("HatEventer", "MsgRegisterReq", codec.encode_integer(2**31) + b"\x80")


def minimal_items_frame(size: int, type_name: str = "MsgSubscribe") -> bytes:
    """A frame of ``size`` bytes of one-byte items: empty types for a subscription, failures
    for a register reply: an honest count, but one value per byte."""
    count = size - 8
    item = {"MsgSubscribe": b"\x80", "MsgRegisterRes": b"\x81"}[type_name]
    return raw_frame("HatEventer", type_name, codec.encode_integer(count) + item * count)


# --- rows 1-4: bad frames -------------------------------------------------------------------


@pytest.mark.parametrize("frames", [1, 5])
def test_a_lying_array_count_is_refused_and_nobody_stalls(
    frames: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows 1 and 2: the first frame closes the connection at its count (the decoder never
    sees it); the frames after it are never read."""

    async def main() -> None:
        async with running(tmp_path) as srv, bystander_of(srv.address):
            await hostile_send(srv.server.port, lying_frame() * frames)

    run(main())
    [line] = warnings_of(caplog)
    assert "array of 2147483648 items at byte 0 needs at least 6442450944 bytes, 1 left" in line


@pytest.mark.parametrize("type_name", ["MsgSubscribe", "MsgRegisterRes"])
def test_a_frame_of_minimal_items_is_refused_before_decoding(
    type_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Row 3: 8 MiB (under the default frame limit) of one-byte items is read, then refused
    by the pre-scan at its count: over the budget of one value per two bytes. Whatever its
    type: a register reply is read without a budget by a client, never by a server (sent
    to one, it was decoded whole, ~1 GiB for 15 MB, before being refused as unexpected)."""

    async def main() -> None:
        async with running(tmp_path) as srv, bystander_of(srv.address) as bystander:
            await hostile_send(srv.server.port, minimal_items_frame(8 * 1024 * 1024, type_name))
            await bystander.rounds_later()

    assert DEFAULT_MAX_FRAME_BYTES > 8 * 1024 * 1024
    run(main())
    [line] = warnings_of(caplog)
    assert f"HatEventer.{type_name}: undecodable SBS (array of 8388600 items" in line
    assert "exceeds the message's budget of values" in line


def test_a_frame_over_the_default_limit_is_refused_at_its_length(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Row 4: a 32 MiB frame is refused by its length prefix; its body is never read."""
    size = 32 * 1024 * 1024

    async def main() -> None:
        async with running(tmp_path) as srv, bystander_of(srv.address):
            head = minimal_items_frame(size)[:64]  # the length prefix and the first bytes
            await hostile_send(srv.server.port, head)

    run(main())
    [line] = warnings_of(caplog)
    assert f"exceeds the limit of {DEFAULT_MAX_FRAME_BYTES} bytes" in line


def test_a_large_legitimate_register_is_decoded_while_others_are_served(tmp_path: Path) -> None:
    """A register of 20,000 events (~1.6 MB, decoded in the decode thread) is stored whole."""
    count = 20_000

    async def main() -> None:
        async with (
            running(tmp_path) as srv,
            bystander_of(srv.address),
            await connect(srv.address) as big,
        ):
            events = [
                NewEvent(("big", str(i % 100)), b"x" * 50, PayloadKind.BINARY) for i in range(count)
            ]
            stored = await big.register_with_response(events)
            assert all(e is not None for e in stored)
            found = await big.query(QueryData(event_types=(("big", "*"),), max_results=0))
            assert found == []
            assert await asyncio.to_thread(srv.store.count) >= count

    run(main(), timeout=60)


# --- rows 5-6: big query replies ------------------------------------------------------------


async def store_big_events(srv: object) -> None:
    engine = srv.engine  # type: ignore[attr-defined]
    events = [
        NewEvent(("big", f"t{i % 50}"), PAYLOAD, PayloadKind.BINARY) for i in range(BIG_EVENTS)
    ]
    stored = await engine.register(events)
    assert all(e is not None for e in stored)


def test_concurrent_unbounded_queries_are_answered_while_registrations_go_on(
    tmp_path: Path,
) -> None:
    """Row 5: four hat clients query every event at once (streamed replies); each gets all of
    them in order, and the bystander completes rounds while the replies are being sent."""

    async def main() -> None:
        async with running(tmp_path) as srv:
            await store_big_events(srv)
            async with bystander_of(srv.address) as bystander:
                clients = [await hat_eventer.connect(srv.address) for _ in range(4)]
                try:
                    query = hat.QueryData(event_types=[("big", "*")], order=hat.Order.ASCENDING)
                    queries = [asyncio.create_task(c.query(query)) for c in clients]
                    before = bystander.rounds
                    replies = await asyncio.gather(*queries)
                    during = bystander.rounds - before
                finally:
                    for client in clients:
                        await client.async_close()
                for events in replies:
                    assert len(events) == BIG_EVENTS
                    assert all(e.payload.data == PAYLOAD for e in events)  # type: ignore[union-attr]
                    keys = [(e.timestamp, e.event_id) for e in events]
                    assert keys == sorted(keys)
                assert during > 0

    run(main(), timeout=120)


def test_a_big_reply_to_a_subscribed_reader_is_not_lag(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Row 6: a reply over twice the lag bound goes to a subscribed hat client that reads
    it; notifications that arrive meanwhile follow the reply."""
    lag_bound = 512 * 1024

    async def main() -> None:
        async with running(tmp_path, max_subscriber_lag_bytes=lag_bound) as srv:
            await store_big_events(srv)
            async with bystander_of(srv.address):
                reader = await hat_eventer.connect(srv.address, [("bystander", "*")])
                try:
                    events = await reader.query(hat.QueryData(event_types=[("big", "*")]))
                    assert len(events) == BIG_EVENTS
                    assert len({e.event_id for e in events}) == BIG_EVENTS
                    notified = await asyncio.wait_for(reader.receive(), 10)
                    assert notified[0].event_type[0] == "bystander"
                finally:
                    await reader.async_close()

    assert BIG_EVENTS * (len(PAYLOAD) + 30) > max(2 * lag_bound, INLINE_REPLY_BYTES)
    run(main(), timeout=120)
    assert not [line for line in warnings_of(caplog) if "slow subscriber" in line]


def test_a_big_reply_nobody_reads_closes_that_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that asks for every event and reads nothing is closed once it has taken
    nothing for ping_interval; the bystander carries on."""

    async def main() -> None:
        async with running(tmp_path, ping_interval=0.5) as srv:
            await store_big_events(srv)
            async with bystander_of(srv.address):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", srv.server.port))
                query = codec.query_to_sbs(QueryData(event_types=(("big", "*"),)))
                sock.sendall(raw_message("HatEventer", "MsgQueryReq", query, last=False))
                sock.setblocking(False)
                await until(lambda: srv.server.client_count == 1)  # the bystander only
                reader, writer = await asyncio.open_connection(sock=sock)
                await wait_peer_closed(reader)
                writer.close()

    run(main(), timeout=60)
    [line] = warnings_of(caplog)
    # Not reading, it answers no ping either; whichever notices first closes it.
    assert "peer took nothing of a reply for 0.5 s" in line or "no ping reply within 0.5" in line


def test_our_client_reads_a_streamed_reply_as_one_frame(tmp_path: Path) -> None:
    """Our own client reads a streamed reply as one frame too (the envelope and length are
    written before the body exists)."""

    async def main() -> None:
        async with running(tmp_path) as srv:
            await store_big_events(srv)
            async with await connect(srv.address) as client:
                events = await client.query(
                    QueryData(event_types=(("big", "*"),), order="ascending")
                )
                assert [e.position for e in events] == sorted(e.position for e in events)
                assert len(events) == BIG_EVENTS and events[0].payload == PAYLOAD
                assert await client.query(QueryData(max_results=1)) != []

    run(main(), timeout=60)


def test_json_payloads_nested_too_deeply_are_refused_alone_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30: 60 KB of ``[[[[`` as an event's JSON payload used to end the connection
    with a RecursionError traceback in the log, per connection; now each such event is
    refused alone (the others of its request are stored), one log line tells of them all,
    and the connection goes on."""
    deep = ("[" * 30_000 + "]" * 30_000).encode()
    bad = [
        NewEvent(("deep", str(n)), payload_kind=PayloadKind.JSON, payload=deep) for n in range(50)
    ]

    async def main() -> None:
        async with running(tmp_path) as srv, await connect(srv.address) as client:
            stored = await client.register_with_response([*bad, NewEvent(("ok", "1"))])
            assert [e is None for e in stored] == [True] * 50 + [False]
            [after] = await client.register_with_response([NewEvent(("ok", "2"))])
            assert after is not None  # the same connection goes on
            found = await client.query(QueryData(event_types=(("deep", "*"),)))
            assert found == []

    with caplog.at_level(logging.INFO):
        run(main())
    refused = [line for line in warnings_of(caplog) if "refused" in line]
    assert len(refused) == 1, refused
    assert "json payload is nested too deeply" in refused[0]
    assert not [r for r in caplog.records if r.exc_info]  # no traceback for a peer's input
