"""A cheap receive path for a WebSocket client that mostly reads binary messages: the
measuring subscribers of :mod:`.subscriber_process` (a few microseconds a frame instead of
the ~80 of the ``websockets`` library's message queue, tasks and futures).

The connection is opened by the ``websockets`` library (its real opening handshake), then
:func:`take_over` moves the socket to a :class:`FrameReader`: a plain
:class:`asyncio.Protocol` parsing server-to-client frames (RFC 6455 section 5: unmasked)
straight from the bytes the socket gives, and handing each binary message to a callback as
``(buffer, start, end)`` without copying it. What it sends (text, pong, close) it encodes
with the library's :class:`websockets.frames.Frame`, masked as a client must.

Why not the library's own lowest level (its sans-I/O protocol)? It builds a ``Frame``
object, copies the payload and queues an event per message: most of the cost this avoids.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

from websockets.frames import Frame, Opcode

from tidings.errors import IntermediaryError

#: Binary messages: ``(buffer, start, end)``; the buffer is only valid during the call.
BinaryHandler = Callable[[bytearray, int, int], None]
TextHandler = Callable[[str], None]
#: Called once when the connection ends, with why (``"closed CODE REASON"`` or an error).
ClosedHandler = Callable[[str], None]

_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_OP_CONTINUATION, _OP_TEXT, _OP_BINARY = 0x0, 0x1, 0x2
_OP_CLOSE, _OP_PING = 0x8, 0x9


class FrameReader(asyncio.Protocol):
    """Parses a server's WebSocket frames from the socket; see the module docstring.

    Fragmented messages are reassembled; pings are answered; a close frame is answered and
    ends the connection. A frame a server must not send (masked, reserved bits, unknown
    opcode) ends the connection with protocol error 1002.
    """

    def __init__(
        self,
        transport: asyncio.Transport,
        binary: BinaryHandler,
        text: TextHandler,
        closed: ClosedHandler,
    ) -> None:
        self.transport = transport
        self._binary = binary
        self._text = text
        self._closed = closed
        self._buffer = bytearray()
        self._fragments: list[bytes] = []
        self._fragment_opcode = 0
        self._ended = False

    # -- asyncio.Protocol ----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        buf = self._buffer
        buf += data
        end = len(buf)
        pos = 0
        while end - pos >= 2:
            b0 = buf[pos]
            size = buf[pos + 1]
            head = 2
            if size >= 126:
                if size == 126:
                    head = 4
                    if end - pos < head:
                        break
                    size = _U16.unpack_from(buf, pos + 2)[0]
                elif size == 127:
                    head = 10
                    if end - pos < head:
                        break
                    size = _U64.unpack_from(buf, pos + 2)[0]
                else:  # the mask bit: a server's frames are never masked
                    self._fail("a masked frame from the server")
                    return
            start = pos + head
            stop = start + size
            if stop > end:
                break
            if b0 == 0x80 | _OP_BINARY:  # the common case: a whole binary message
                self._binary(buf, start, stop)
            elif not self._other(b0, bytes(buf[start:stop])):
                return
            pos = stop
        if pos:
            del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(f"connection lost: {exc}" if exc else "connection lost")

    # -- sending -------------------------------------------------------------------------

    def send_text(self, text: str) -> None:
        self._send(Opcode.TEXT, text.encode())

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame and close the socket (without waiting for the server's)."""
        if not self.transport.is_closing():
            self._send(Opcode.CLOSE, _U16.pack(code) + reason.encode())
            self.transport.close()

    def _send(self, opcode: Opcode, payload: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(Frame(opcode, payload).serialize(mask=True))

    # -- everything but a whole binary message -------------------------------------------

    def _other(self, b0: int, payload: bytes) -> bool:
        """Handle one frame; False if the connection ended."""
        fin, opcode = b0 & 0x80, b0 & 0x0F
        if b0 & 0x70:
            return self._fail("reserved bits set (no extension was negotiated)")
        if opcode == _OP_PING:
            self._send(Opcode.PONG, payload)
        elif opcode == _OP_CLOSE:
            code = _U16.unpack_from(payload)[0] if len(payload) >= 2 else 1005
            reason = payload[2:].decode(errors="replace")
            self.close(code if code != 1005 else 1000)
            self._end(f"closed {code} {reason}".rstrip())
            return False
        elif opcode in (_OP_TEXT, _OP_BINARY, _OP_CONTINUATION):
            if (opcode == _OP_CONTINUATION) != bool(self._fragments):
                return self._fail("a continuation frame out of place")
            if opcode != _OP_CONTINUATION:
                self._fragment_opcode = opcode
            self._fragments.append(payload)
            if fin:
                message = b"".join(self._fragments)
                self._fragments.clear()
                self._deliver(self._fragment_opcode, message)
        elif opcode != 0xA:  # a pong needs nothing
            return self._fail(f"unknown opcode {opcode}")
        return True

    def _deliver(self, opcode: int, message: bytes) -> None:
        if opcode == _OP_TEXT:
            self._text(message.decode())
        else:
            buf = bytearray(message)
            self._binary(buf, 0, len(buf))

    def _fail(self, why: str) -> bool:
        self.close(1002, why)
        self._end(f"protocol error: {why}")
        return False

    def _end(self, why: str) -> None:
        if not self._ended:
            self._ended = True
            self._closed(why)


def take_over(
    websocket: Any, binary: BinaryHandler, text: TextHandler, closed: ClosedHandler
) -> FrameReader:
    """Move an open ``websockets`` client connection's socket to a :class:`FrameReader`.

    Call it only when the server has nothing unread on the way (e.g. between a reply and the
    next request): bytes the library already read stay with it. The library's keepalive
    must be off (``ping_interval=None``): it would write on the socket too.
    """
    transport = websocket.transport
    if transport is None or transport.is_closing():
        raise IntermediaryError("wsreceive: the connection is not open")
    reader = FrameReader(transport, binary, text, closed)
    transport.set_protocol(reader)
    return reader
