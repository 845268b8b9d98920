"""The cheap WebSocket receive path (:mod:`tidings.intermediary.measurement.wsreceive`): it reads
exactly what the ``websockets`` library would, answers pings as a client must, and works on a real
intermediary's connection after the library's handshake."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket

import websockets
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from tests.support.intermediary_helpers import SMALL, WORLD
from tidings.intermediary.measurement.wsreceive import FrameReader, take_over
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.generation import FrameKind, decode_frame
from tidings.intermediary.node.intermediary import Intermediary
from tidings.intermediary.publisher.simulation import Simulation
from tidings.intermediary.serving.envelope import open_envelope
from tidings.intermediary.serving.transport import IntermediaryServer

WAIT = 60.0


def _pattern(size: int) -> bytes:
    return bytes(range(251)) * (size // 251) + bytes(range(size % 251))


#: A message: text or binary, its payload, and how many frames it is sent in.
messages = st.lists(
    st.tuples(
        st.booleans(),
        # Short ones, and long ones in both extended lengths (16 and 64 bits).
        st.one_of(st.binary(max_size=200), st.integers(126, 70_000).map(_pattern)),
        st.integers(1, 3),
        st.booleans(),  # a ping before it
    ),
    max_size=8,
)


def server_bytes(items: list[tuple[bool, bytes, int, bool]]) -> tuple[bytes, list, list]:
    """The frames a server sends for ``items`` (the library's encoder, unmasked), the
    messages a reader should deliver and the pings it should answer."""
    out: list[bytes] = []
    expected: list[tuple[str, bytes | str]] = []
    pings: list[bytes] = []
    for n, (is_text, payload, parts, ping) in enumerate(items):
        data = payload.hex().encode() if is_text else payload
        if ping:
            pings.append(b"p%d" % n)
            out.append(Frame(Opcode.PING, pings[-1]).serialize(mask=False))
        cut = [len(data) * i // parts for i in range(parts + 1)]
        for i in range(parts):
            opcode = (Opcode.TEXT if is_text else Opcode.BINARY) if i == 0 else Opcode.CONT
            chunk = data[cut[i] : cut[i + 1]]
            out.append(Frame(opcode, chunk, fin=i == parts - 1).serialize(mask=False))
        expected.append(("text", data.decode()) if is_text else ("binary", data))
    return b"".join(out), expected, pings


def client_frames(data: bytes) -> list[Frame]:
    """Parse what the reader sent with the library's decoder (masked, as a client's)."""
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    frames = []
    while reader.buffer:
        parser = Frame.parse(reader.read_exact, mask=True)
        try:
            while True:
                next(parser)
        except StopIteration as done:
            frames.append(done.value)
    return frames


@settings(max_examples=40, deadline=None)
@given(items=messages, cuts=st.lists(st.integers(0, 140_000), max_size=12))
def test_any_split_of_a_servers_frames_reads_the_same_messages_and_answers_pings(
    items: list[tuple[bool, bytes, int, bool]], cuts: list[int]
) -> None:
    stream, expected, pings = server_bytes(items)

    async def main() -> tuple[list, list[Frame]]:
        ours, peer = socket.socketpair()
        got: list[tuple[str, bytes | str]] = []
        ended: list[str] = []
        reader = FrameReader(
            None,  # type: ignore[arg-type]  # set by connection_made below
            lambda buf, start, end: got.append(("binary", bytes(buf[start:end]))),
            lambda text: got.append(("text", text)),
            ended.append,
        )
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(lambda: reader, sock=ours)
        reader.transport = transport  # type: ignore[assignment]
        edges = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
        for a, b in itertools.pairwise(edges):
            reader.data_received(stream[a:b])
        transport.close()
        await asyncio.sleep(0)
        peer.setblocking(False)
        sent = b""
        while True:
            chunk = await loop.sock_recv(peer, 1 << 16)
            if not chunk:
                break
            sent += chunk
        peer.close()
        assert ended == ["connection lost"]
        return got, client_frames(sent)

    got, answers = asyncio.run(main())
    assert got == expected
    assert [(f.opcode, f.data) for f in answers] == [(Opcode.PONG, p) for p in pings]


def test_a_close_frame_is_answered_and_reported_and_a_masked_frame_is_a_protocol_error() -> None:
    async def main() -> tuple[list[str], list[Frame], list[str]]:
        results = []
        for server_frame in (
            Frame(Opcode.CLOSE, b"\x03\xe9going away").serialize(mask=False),
            Frame(Opcode.BINARY, b"x").serialize(mask=True),
        ):
            ours, peer = socket.socketpair()
            ended: list[str] = []
            reader = FrameReader(None, print, print, ended.append)  # type: ignore[arg-type]
            transport, _ = await asyncio.get_running_loop().create_connection(
                lambda r=reader: r, sock=ours
            )
            reader.transport = transport  # type: ignore[assignment]
            reader.data_received(server_frame)
            await asyncio.sleep(0.05)
            peer.setblocking(False)
            sent = await asyncio.get_running_loop().sock_recv(peer, 1 << 16)
            peer.close()
            results.append((ended, client_frames(sent)))
        return results

    (closed, answer), (failed, refusal) = asyncio.run(main())
    assert closed == ["closed 1001 going away"]
    assert [(f.opcode, f.data[:2]) for f in answer] == [(Opcode.CLOSE, b"\x03\xe9")]
    assert failed == ["protocol error: a masked frame from the server"]
    assert [(f.opcode, f.data[:2]) for f in refusal] == [(Opcode.CLOSE, b"\x03\xea")]


def test_a_real_intermediarys_frames_arrive_through_the_reader_after_the_librarys_handshake() -> (
    None
):
    sim = Simulation(200, WORLD, max_speed=5.0, seed=4)
    feed = sim.feed()
    node = Intermediary(2, feed, world=WORLD)

    def source() -> list[UpdateBatch]:
        sim.step(0.05)
        return [feed.batch()]

    async def main() -> tuple[list[str], list[bytes], list[str]]:
        server = IntermediaryServer(node, source=source, tick_s=0.01)
        await server.start()
        texts: list[str] = []
        frames: list[bytes] = []
        ended: list[str] = []
        try:
            websocket = await websockets.connect(
                f"ws://127.0.0.1:{server.port}/", compression=None, ping_interval=None
            )
            hello = json.loads(await websocket.recv())
            assert hello["op"] == "hello"
            reader = take_over(
                websocket,
                lambda buf, start, end: frames.append(bytes(buf[start:end])),
                texts.append,
                ended.append,
            )
            request = {"op": "subscribe", "key": "v", "region": SMALL, "rate_hz": 100}
            reader.send_text(json.dumps(request))

            async def enough() -> None:
                while len(frames) < 5:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(enough(), WAIT)
        finally:
            await server.aclose()
        await asyncio.wait_for(_until(lambda: bool(ended)), WAIT)
        return texts, frames, ended

    texts, frames, ended = asyncio.run(main())
    assert json.loads(texts[0])["op"] == "subscribed"
    for message in frames:
        key, frame = open_envelope(message)
        header, _, _ = decode_frame(frame)
        assert key == "v"
        assert header.kind in (FrameKind.VIEW, FrameKind.EMPTY, FrameKind.UNCHANGED)
    assert any(decode_frame(open_envelope(m)[1])[0].kind is FrameKind.VIEW for m in frames)
    # The server's shutdown close (uvicorn: 1012, service restart), read by the reader.
    assert ended == ["closed 1012"]


async def _until(check: object) -> None:
    while not check():  # type: ignore[operator]
        await asyncio.sleep(0.01)
