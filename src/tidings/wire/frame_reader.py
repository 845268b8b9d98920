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
#: What is read of an oversize frame to learn which conversation it belongs to: the
#: envelope's fields before the body (two integers, three flags, the module and type names
#: and the body's length) take well under this.
OVERSIZE_HEAD_BYTES = 256
#: The first byte of a TLS record, read as a length of length, and what it tells: the peer
#: speaks TLS on a plaintext link (a ``tcp+sbs`` address where ``ssl+sbs`` is served).
_TLS_RECORDS = {
    21: " (a TLS alert: the peer speaks TLS, use an ssl+sbs:// address)",
    22: " (a TLS handshake: the peer speaks TLS, serve or use an ssl+sbs:// address)",
}


class ReadProgress:
    """What a connection has read: the bytes of frames taken so far, and whether it is
    handling (decoding, dispatching) a frame it read. Its pinger judges the peer by this too:
    a pong waits behind a large frame the peer is still sending, or in the socket while
    this end decodes one, and neither means the peer is gone."""

    __slots__ = ("busy", "taken")

    def __init__(self) -> None:
        self.taken = 0
        self.busy = False


class FrameTooLarge(ProtocolError):
    """A frame announced more than ``max_frame_bytes``; nothing of it was read yet (the
    stream stands at its envelope), so the reader may still skip it whole."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"frame of {size} bytes exceeds the limit of {limit} bytes (max_frame_bytes)"
        )
        self.size = size
        self.limit = limit


async def read_frame(
    reader: asyncio.StreamReader, max_frame_bytes: int, progress: ReadProgress | None = None
) -> bytes | bytearray:
    """The next frame's envelope (the bytes after its length prefix); ``progress`` counts
    the bytes of a large one as they arrive.

    A frame over ``max_frame_bytes`` is a :class:`FrameTooLarge`, one with an invalid prefix
    a :class:`ProtocolError`; a stream that ends inside a frame raises
    :class:`asyncio.IncompleteReadError` or :class:`ProtocolError`, both naming how much of
    it arrived.
    """
    length_size = (await reader.readexactly(1))[0]
    if not 1 <= length_size <= envelope.MAX_LENGTH_BYTES:
        hint = _TLS_RECORDS.get(length_size, "")
        raise ProtocolError(f"invalid frame: length of length {length_size}{hint}")
    size = int.from_bytes(await reader.readexactly(length_size), "big")
    if size > max_frame_bytes:
        raise FrameTooLarge(size, max_frame_bytes)
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
        if progress is not None:
            progress.taken += len(piece)
    return frame


async def read_oversize_head(
    reader: asyncio.StreamReader, too_large: FrameTooLarge
) -> tuple[envelope.Envelope, int]:
    """The envelope of an oversize frame (its body left out), read from its first bytes,
    and how many of its bytes are left (for :func:`skip_frame`); ``too_large`` if they are
    no envelope."""
    prefix = await reader.readexactly(min(too_large.size, OVERSIZE_HEAD_BYTES))
    try:
        fields, _, _ = envelope.parse_head(prefix)
    except ProtocolError:
        raise too_large from None
    return envelope.Envelope(*fields, memoryview(b"")), too_large.size - len(prefix)


async def skip_frame(
    reader: asyncio.StreamReader, size: int, progress: ReadProgress | None = None
) -> None:
    """Read past the rest (``size`` bytes) of an oversize frame, a piece at a time, keeping
    none of it; ``progress`` counts the bytes."""
    left = size
    while left:
        piece = await reader.read(min(left, _READ_CHUNK))
        if not piece:
            raise ProtocolError(f"truncated frame ({size - left} of {size} bytes skipped)")
        left -= len(piece)
        if progress is not None:
            progress.taken += len(piece)


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
