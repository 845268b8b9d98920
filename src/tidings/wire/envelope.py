"""The chatter frame around every message: a length prefix and the ``Hat.Msg`` envelope.

A frame is one byte giving the length of the length, the big-endian length, then the SBS
``Hat.Msg`` record ``{id, first, owner, token, last, data: {module, type, data}}`` whose
last field, ``data``, is the message body as SBS ``Bytes`` (its length, then the body).

Because the body comes last, a frame's head (everything before the body) depends only on
the body's size: :func:`frame_head` builds it without the body, so a large body can be
written after it piece by piece (a streamed query reply), and :func:`parse` reads the
envelope's few fields by hand and hands back the body as a view into the frame, so that a
large frame is never copied to be decoded. :func:`parse_head` reads those fields from a
frame's first bytes alone: a reply over the frame limit is skipped, not read, once its
conversation is known.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from tidings.errors import ProtocolError
from tidings.wire import codec
from tidings.wire.prescan import read_integer

#: The longest length prefix: eight bytes of length.
MAX_LENGTH_BYTES = 8


class Envelope(NamedTuple):
    """A received frame's envelope; ``body`` is a view into the frame. (A tuple: one is
    made for every message received, and a frozen dataclass's ``__init__`` costs a call per
    field.)"""

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
    :class:`ProtocolError`, as hat-sbs's decoder would refuse them.

    Runs for every message received: the few module and type names are looked up, not
    decoded each time."""
    end = len(frame)
    fields, size, start = parse_head(frame)
    if size != end - start:
        raise ProtocolError(f"Hat.Msg: undecodable SBS (body of {size} bytes, {end - start} left)")
    return Envelope(*fields, memoryview(frame)[start:])


def parse_head(
    data: bytes | bytearray,
) -> tuple[tuple[int, int, bool, bool, bool, str | None, str], int, int]:
    """The envelope's fields before the body (an :class:`Envelope`'s, in order), the body's
    size and where it starts, read from the start of a frame: the whole frame, or only its
    first bytes (an oversize frame is skipped once its conversation is known)."""
    end = len(data)
    try:
        message_id, pos = read_integer(data, 0, end)
        first, pos = read_integer(data, pos, end)
        if pos + 3 > end:
            raise ProtocolError("envelope ends in its flags")
        owner, token, last = data[pos] != 0, data[pos + 1] != 0, data[pos + 2] != 0
        has_module, pos = read_integer(data, pos + 3, end)
        if has_module not in (0, 1):
            raise ProtocolError(f"module choice index {has_module} is not in the schema")
        module = None
        if has_module:
            module, pos = _name(data, pos, end)
        type_name, pos = _name(data, pos, end)
        size, pos = read_integer(data, pos, end)
    except ProtocolError as exc:
        raise ProtocolError(f"Hat.Msg: undecodable SBS ({exc})") from None
    return (message_id, first, owner, token, last, module, type_name), size, pos


#: The protocol's module and message type names, by their bytes; other names are decoded
#: each time (and then refused: see chatter), so no peer can fill this.
_NAMES: dict[bytes, str] = {
    name.encode(): name
    for module, types in codec.MESSAGE_TYPES.items()
    for name in (module, *types)
}


def _name(data: bytes | bytearray, pos: int, end: int) -> tuple[str, int]:
    size, pos = read_integer(data, pos, end)
    if not 0 <= size <= end - pos:
        raise ProtocolError(f"string of {size} bytes at byte {pos}, {end - pos} left")
    raw = bytes(data[pos : pos + size])
    name = _NAMES.get(raw)
    if name is None:
        try:
            name = raw.decode()
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"string at byte {pos} is not UTF-8") from exc
    return name, pos + size
