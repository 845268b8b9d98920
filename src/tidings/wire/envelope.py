"""The chatter frame around every message: a length prefix and the ``Hat.Msg`` envelope.

A frame is one byte giving the length of the length, the big-endian length, then the SBS
``Hat.Msg`` record ``{id, first, owner, token, last, data: {module, type, data}}`` whose
last field, ``data``, is the message body as SBS ``Bytes`` (its length, then the body).

Because the body comes last, a frame's head (everything before the body) depends only on
the body's size: :func:`frame_head` builds it without the body, so a large body can be
written after it piece by piece (a streamed query reply), and :func:`parse` reads the
envelope's few fields by hand and hands back the body as a view into the frame, so that a
large frame is never copied to be decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tidings.errors import ProtocolError
from tidings.wire import codec
from tidings.wire.prescan import read_integer

#: The longest length prefix: eight bytes of length.
MAX_LENGTH_BYTES = 8


@dataclass(frozen=True, slots=True)
class Envelope:
    """A received frame's envelope; ``body`` is a view into the frame."""

    id: int
    first: int
    owner: bool
    token: bool
    last: bool
    module: str | None
    type: str
    body: memoryview


def frame_head(
    message_id: int,
    first: int,
    owner: bool,
    last: bool,
    module: str,
    type_name: str,
    body_size: int,
) -> bytes:
    """The bytes of a frame before its body of ``body_size`` bytes: the ``Hat.Msg`` record
    written field by field (as :func:`parse` reads it), since every reply and notification
    needs one."""
    head = b"".join(
        (
            codec.encode_integer(message_id),
            codec.encode_integer(first),
            bytes((owner, True, last)),  # owner, token, last
            _names(module, type_name),
            codec.encode_integer(body_size),
        )
    )
    size = len(head) + body_size
    length = size.to_bytes(max(1, (size.bit_length() + 7) // 8), "big")
    return bytes([len(length)]) + length + head


@lru_cache(maxsize=64)
def _names(module: str, type_name: str) -> bytes:
    """The envelope's ``data.module`` (``('value', module)``) and ``data.type``."""
    module_bytes, type_bytes = module.encode(), type_name.encode()
    return b"".join(
        (
            codec.encode_integer(1),  # the choice's "value" entry
            codec.encode_integer(len(module_bytes)),
            module_bytes,
            codec.encode_integer(len(type_bytes)),
            type_bytes,
        )
    )


def parse(frame: bytes | bytearray) -> Envelope:
    """The envelope of a frame's message (without the length prefix); malformed bytes raise
    :class:`ProtocolError`, as hat-sbs's decoder would refuse them."""
    view = memoryview(frame)
    end = len(view)
    try:
        message_id, pos = read_integer(view, 0, end)
        first, pos = read_integer(view, pos, end)
        if pos + 3 > end:
            raise ProtocolError("envelope ends in its flags")
        owner, token, last = view[pos] != 0, view[pos + 1] != 0, view[pos + 2] != 0
        has_module, pos = read_integer(view, pos + 3, end)
        if has_module not in (0, 1):
            raise ProtocolError(f"module choice index {has_module} is not in the schema")
        module = None
        if has_module:
            module, pos = _string(view, pos, end)
        type_name, pos = _string(view, pos, end)
        size, pos = read_integer(view, pos, end)
    except ProtocolError as exc:
        raise ProtocolError(f"Hat.Msg: undecodable SBS ({exc})") from None
    if size != end - pos:
        raise ProtocolError(f"Hat.Msg: undecodable SBS (body of {size} bytes, {end - pos} left)")
    return Envelope(message_id, first, owner, token, last, module, type_name, view[pos:])


def _string(view: memoryview, pos: int, end: int) -> tuple[str, int]:
    size, pos = read_integer(view, pos, end)
    if not 0 <= size <= end - pos:
        raise ProtocolError(f"string of {size} bytes at byte {pos}, {end - pos} left")
    try:
        return str(view[pos : pos + size], "utf-8"), pos + size
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"string at byte {pos} is not UTF-8") from exc
