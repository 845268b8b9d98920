"""Reading chatter frames off a socket, and decoding their bodies, without stalling the loop.

A connection reads and decodes one frame at a time. A large frame is read in pieces as its
bytes arrive (never allocated from the length it announces, never held twice), and its body
is pre-scanned (:mod:`tidings.wire.prescan`: lying counts and messages over their budget of
values are refused before anything is allocated) and decoded in the process's one decode
thread, so that neither stalls the event loop for the other connections.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from tidings.errors import ProtocolError
from tidings.wire import codec, envelope

#: Bodies up to this size are decoded on the event loop (tens of microseconds); larger ones
#: in the decode thread, a run of :data:`_DECODE_SLICE_BYTES` at a time.
INLINE_DECODE_BYTES = 64 * 1024
_DECODE_SLICE_BYTES = 64 * 1024
#: Reading a large frame takes the socket's bytes this many at a time.
_READ_CHUNK = 256 * 1024
#: The first byte of a TLS record, read as a length of length, and what it tells: the peer
#: speaks TLS on a plaintext link (a ``tcp+sbs`` address where ``ssl+sbs`` is served).
_TLS_RECORDS = {
    21: " (a TLS alert: the peer speaks TLS, use an ssl+sbs:// address)",
    22: " (a TLS handshake: the peer speaks TLS, serve or use an ssl+sbs:// address)",
}


async def read_frame(reader: asyncio.StreamReader, max_frame_bytes: int) -> bytes | bytearray:
    """The next frame's envelope (the bytes after its length prefix).

    A frame over ``max_frame_bytes`` or with an invalid prefix is a :class:`ProtocolError`;
    a stream that ends inside a frame raises :class:`asyncio.IncompleteReadError` or
    :class:`ProtocolError`, both naming how much of it arrived.
    """
    length_size = (await reader.readexactly(1))[0]
    if not 1 <= length_size <= envelope.MAX_LENGTH_BYTES:
        hint = _TLS_RECORDS.get(length_size, "")
        raise ProtocolError(f"invalid frame: length of length {length_size}{hint}")
    size = int.from_bytes(await reader.readexactly(length_size), "big")
    if size > max_frame_bytes:
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {max_frame_bytes} bytes")
    if size <= _READ_CHUNK:
        return await reader.readexactly(size)
    # Grown as the bytes arrive (not allocated from the announced size), and never held
    # twice: readexactly would gather the whole frame in the reader's buffer and copy it.
    frame = bytearray()
    while len(frame) < size:
        piece = await reader.read(min(size - len(frame), _READ_CHUNK))
        if not piece:
            raise ProtocolError(f"truncated frame ({len(frame)} of {size} bytes)")
        frame += piece
    return frame


async def decode_body(
    module: str, type_name: str, body: memoryview, *, from_server: bool
) -> codec.Value:
    """The decoded body: on the loop if small, else in the decode thread, one run of items
    at a time, so that neither a large message nor its pre-scan holds up other
    connections. ``from_server``: see :func:`codec.value_budget`."""
    if len(body) <= INLINE_DECODE_BYTES:
        return codec.decode(module, type_name, body, from_server=from_server)
    decode = partial(codec.decode_in_slices, from_server=from_server)
    return await asyncio.get_running_loop().run_in_executor(
        _decoder(), decode, module, type_name, body, _DECODE_SLICE_BYTES
    )


_DECODER: ThreadPoolExecutor | None = None


def _decoder() -> ThreadPoolExecutor:
    """The process's one decode thread: large messages are decoded one at a time, so the
    memory they take while decoding is that of one message, however many peers send them."""
    global _DECODER
    if _DECODER is None:
        _DECODER = ThreadPoolExecutor(1, thread_name_prefix="tidings-decode")
    return _DECODER
