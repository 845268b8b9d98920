"""Chatter connections: the message transport of hat-event 0.8.5, over asyncio TCP.

A frame is one byte giving the length of the length, the big-endian length, then an
SBS-encoded ``Hat.Msg`` envelope whose ``data`` carries the protocol message (module, type,
SBS body). Each side numbers the messages it sends 1, 2, 3...; a conversation is named by
the id of its first message and by which side opened it, and a message with ``last`` set
closes it. Both sides ping every ``ping_interval`` seconds and drop a peer that does not
answer within the same time.

:class:`Connection` reads in a task of its own: pings are answered there, replies to our own
requests resolve their futures there, and every other message is decoded and queued for
:meth:`Connection.receive`. The queue is bounded (:mod:`tidings.wire.receive_queue`), so a
peer that sends faster than it is served stops being read instead of growing our memory.
Anything malformed (garbage, a truncated or oversize frame, an unknown message type,
undecodable SBS) closes that connection with one log line naming the reason; nothing else
is affected. One oversize frame is not malformed: a reply to one of our own requests. A
hat-event server answers a query with every event it selects, in one message, however large
(hat-event 0.8.5 has no paging), so such a reply is read past and dropped, its request fails
with :class:`ReplyTooLarge` naming the size and ``max_frame_bytes``, and the connection is
kept.

One frame is read and decoded at a time per connection, a large one without stalling the
event loop (:mod:`tidings.wire.frame_reader`). A large outgoing message can be streamed
(:meth:`Connection.send_stream`): frames sent meanwhile wait behind it, so frames never
interleave. :func:`tidings.wire.chatter_client.connect` opens a connection;
:mod:`tidings.wire.chatter_server` listens for them. Over TLS (an ``ssl+sbs://`` address,
as in hat-event 0.8.5) the frames are the same, inside the TLS session; a peer's verified
client certificate names it (:attr:`Connection.certificate_identity`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
from collections.abc import AsyncIterable, Callable
from typing import Any, NamedTuple

from tidings.errors import (
    ConnectionClosed,
    ProtocolError,
    ReplyTooLarge,
    RequestTimeout,
)
from tidings.wire import codec, envelope
from tidings.wire.frame_reader import (
    INLINE_DECODE_BYTES,
    FrameTooLarge,
    ReadProgress,
    decode_body,
    read_frame,
    read_oversize_head,
    skip_frame,
)
from tidings.wire.lag import LagWatch
from tidings.wire.receive_queue import ReceiveQueue

log = logging.getLogger(__name__)

#: Default bound on one frame's SBS envelope (the whole message), in bytes. A client reading
#: replies keeps this; the Eventer server sets its own, lower bound on what clients send.
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
#: hat-event 0.8.5's keep-alive period, in seconds.
DEFAULT_PING_INTERVAL = 20.0
#: Received messages waiting for :meth:`Connection.receive` before reading pauses.
_RECEIVE_QUEUE = 256
#: Default bound on the bytes of those messages (as framed) before reading pauses.
DEFAULT_MAX_QUEUED_BYTES = 16 * 1024 * 1024
#: How long closing waits for unsent bytes to reach the peer before dropping them.
_CLOSE_FLUSH_SECONDS = 5.0


class Conversation(NamedTuple):
    """A conversation as this side sees it: who opened it and its first message id. (This
    and :class:`Message` are tuples: one of each is made for every message received, and a
    frozen dataclass's ``__init__`` costs a call per field.)"""

    owner: bool
    first_id: int


class Message(NamedTuple):
    """A received message with its decoded body."""

    conversation: Conversation
    #: The message opens a new conversation.
    first: bool
    #: The sender closes the conversation with it (no reply expected).
    last: bool
    module: str
    type: str
    data: codec.Value


class Connection:
    """One chatter connection; use :func:`connect` or :func:`.chatter_server.listen` to get
    one."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        ping_interval: float | None = DEFAULT_PING_INTERVAL,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
        to_server: bool = False,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._max_frame_bytes = max_frame_bytes
        #: This end connected to a server (:func:`connect`): what it reads comes from the
        #: server it chose, and has no budget of values (see :func:`codec.value_budget`).
        self._to_server = to_server
        self._ping_interval = ping_interval
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        #: The peer's host (an IP address), for decisions by where a client connects from.
        self.peer_host: str | None = peer[0] if isinstance(peer, tuple) else None
        #: The link is TLS.
        self.secure = writer.get_extra_info("sslcontext") is not None
        #: The CN of the peer's verified certificate (mutual TLS), else None.
        self.certificate_identity = certificate_identity(writer)
        self._ids = itertools.count(1)
        self._received: ReceiveQueue[Message] = ReceiveQueue(_RECEIVE_QUEUE, max_queued_bytes)
        #: Offered each received message while the receiver waits for one (take_directly).
        self._direct: Callable[[Message], bool] | None = None
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._closed = asyncio.Event()
        self._close_reason: str | None = None
        self._pongs: dict[int, asyncio.Event] = {}
        #: While a streamed frame is being written, other frames wait here, in order.
        self._streaming = False
        self._held: list[bytes] = []
        self._held_bytes = 0
        #: Every byte handed to the socket or held for it; minus what is unsent, what the
        #: peer took (see lagging).
        self._written = 0
        self._lag = LagWatch()
        self._progress = ReadProgress()
        self._tasks = [asyncio.create_task(self._read_loop(), name=f"chatter read {self.peer}")]
        if ping_interval:
            pinger = self._ping_loop(ping_interval)
            self._tasks.append(asyncio.create_task(pinger, name=f"chatter ping {self.peer}"))

    @property
    def is_open(self) -> bool:
        return not self._closed.is_set()

    @property
    def max_frame_bytes(self) -> int:
        """The largest frame this end reads (see :class:`ReplyTooLarge` for a reply over it)."""
        return self._max_frame_bytes

    @property
    def close_reason(self) -> str | None:
        """Why the connection closed (None while open or after a clean close)."""
        return self._close_reason

    @property
    def send_buffer_bytes(self) -> int:
        """Bytes sent but not yet taken by the socket: how far the peer lags behind.

        Frames held back behind a streamed frame count; the streamed frame itself counts
        only with the piece that waits in the buffer (see :meth:`send_stream`).
        """
        transport = self._writer.transport
        if transport.is_closing():
            return 0
        return transport.get_write_buffer_size() + self._held_bytes

    def lagging(self, limit: int, grace: float, name: str = "limit") -> str | None:
        """Why the peer counts as too slow to be sent more, or None while it keeps up (the
        rule of :class:`~tidings.wire.lag.LagWatch`). Judged when a message is due, before
        it is sent, so a message never counts against itself."""
        return self._lag.judge(self.send_buffer_bytes, self._written, limit, grace, name)

    def send(
        self,
        module: str,
        type_name: str,
        value: codec.Value,
        *,
        conversation: Conversation | None = None,
        last: bool = True,
    ) -> Conversation:
        """Send a message, opening a new conversation unless ``conversation`` is given.

        Returns the conversation, so that a request's reply can be recognised. Writing is
        buffered; await :meth:`drain` to wait for the socket.
        """
        return self.send_encoded(
            module,
            type_name,
            codec.encode(module, type_name, value),
            conversation=conversation,
            last=last,
        )

    def send_encoded(
        self,
        module: str,
        type_name: str,
        body: bytes,
        *,
        conversation: Conversation | None = None,
        last: bool = True,
    ) -> Conversation:
        """:meth:`send` with the body already SBS-encoded (one encoding for many receivers)."""
        head, conversation = self._frame_head(conversation, last, module, type_name, len(body))
        frame = head + body
        self._written += len(frame)
        if self._streaming:
            self._held.append(frame)
            self._held_bytes += len(frame)
        else:
            self._writer.write(frame)
        return conversation

    async def send_stream(
        self,
        module: str,
        type_name: str,
        body_size: int,
        body: AsyncIterable[bytes],
        *,
        conversation: Conversation | None = None,
        last: bool = True,
        stall_seconds: float,
    ) -> Conversation:
        """Send a message whose body of ``body_size`` bytes comes in pieces from ``body``.

        Each piece is written once the socket has taken the one before, so a large reply
        costs one piece of memory, not the whole body. Frames sent meanwhile (notifications,
        pongs) wait and follow the streamed frame. A peer that takes nothing for
        ``stall_seconds`` is not reading: the connection is closed. The pieces must add up
        to ``body_size`` exactly, else the frame would be corrupt: the connection is closed
        (and :class:`ConnectionClosed` raised) instead. An exception from ``body`` closes
        the connection too, and propagates.
        """
        if self._streaming:
            raise RuntimeError("one streamed frame at a time per connection")
        head, conversation = self._frame_head(conversation, last, module, type_name, body_size)
        self._writer.write(head)
        self._written += len(head)
        self._streaming = True
        sent = 0
        try:
            async for piece in body:
                sent += len(piece)
                if sent > body_size:
                    break
                await self._drain_within(stall_seconds)
                self._writer.write(piece)
                self._written += len(piece)
        except BaseException:
            self.close(f"{module}.{type_name} could not be completed")
            raise
        finally:
            self._streaming = False
        if sent != body_size:
            self.close(f"{module}.{type_name}: {sent} bytes of an announced {body_size}")
            raise ConnectionClosed(f"connection to {self.peer} closed: corrupt streamed frame")
        held, self._held, self._held_bytes = self._held, [], 0
        if not self._closed.is_set():
            self._writer.writelines(held)
        return conversation

    def _frame_head(
        self,
        conversation: Conversation | None,
        last: bool,
        module: str,
        type_name: str,
        body_size: int,
    ) -> tuple[bytes, Conversation]:
        """The head of our next frame, and its conversation (a new one unless given)."""
        if self._closed.is_set():
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        message_id = next(self._ids)
        if conversation is None:
            conversation = Conversation(owner=True, first_id=message_id)
        head = envelope.frame_head(
            message_id,
            conversation.first_id,
            conversation.owner,
            last,
            module,
            type_name,
            body_size,
        )
        return head, conversation

    async def _drain_within(self, seconds: float) -> None:
        """:meth:`drain`, closing the connection if the peer takes nothing for ``seconds``."""
        try:
            async with asyncio.timeout(seconds):
                await self.drain()
        except TimeoutError:
            self.close(f"peer took nothing of a reply for {seconds:g} s")
            raise ConnectionClosed(f"connection to {self.peer} closed: not reading") from None

    async def drain(self) -> None:
        """Wait until the socket has taken what was written (or raise if it closed)."""
        try:
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise ConnectionClosed(f"connection to {self.peer} is closed: {exc}") from exc

    async def request(
        self, module: str, type_name: str, value: codec.Value, timeout: float | None = None
    ) -> Message:
        """Open a conversation with a message and return the peer's reply in it.

        :class:`RequestTimeout` if no reply came within ``timeout`` seconds (None: no bound).
        """
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        conversation = self.send(module, type_name, value, last=False)
        self._pending[conversation.first_id] = future
        try:
            await self.drain()
            closed = asyncio.ensure_future(self._closed.wait())
            waits: set[asyncio.Future[Any]] = {future, closed}
            try:
                done, _ = await asyncio.wait(
                    waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                closed.cancel()
            if future in done:
                return future.result()
            if not done:
                raise RequestTimeout(
                    f"{module}.{type_name}: no reply from {self.peer} in {timeout}s"
                )
            reason = self._close_reason or "closed"
            raise ConnectionClosed(f"connection to {self.peer} closed before the reply: {reason}")
        finally:
            self._pending.pop(conversation.first_id, None)

    async def receive(self) -> Message:
        """The next received message that is not a ping or a reply to :meth:`request`."""
        if self._closed.is_set() and self._received.empty():
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        message = await self._received.get()
        if message is None:
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        return message

    def take_directly(self, handler: Callable[[Message], bool] | None) -> None:
        """Offer each received message to ``handler`` in the reading task, before it is
        queued, whenever the receiver waits in :meth:`receive` with nothing queued and
        nothing after the message has been read yet; if ``handler`` returns True the
        message was handled and is not queued. None: stop.

        Meant for a server whose receiver handles one message at a time, awaiting each
        before it asks for the next: while it waits, everything received before was
        handled, so a message the handler takes at once (a small register) is handled in
        the order received, without waking the receiver, a turn of the event loop per
        request. A peer sending many messages at once (pipelined) has them queued for
        the receiver as before, which takes them in runs. ``handler`` must not block, and
        must return False for anything it cannot finish without waiting: that goes to the
        receiver as before.
        """
        self._direct = handler

    @property
    def has_received(self) -> bool:
        """Received messages are waiting to be taken, or bytes of the next ones have been
        read from the socket already (the peer sent several at once)."""
        return not self._received.empty() or self._read_ahead

    @property
    def _read_ahead(self) -> bool:
        """Bytes after the frame being handled have been read from the socket already."""
        # StreamReader keeps what it read in ``_buffer``; it has no public size of it.
        return bool(getattr(self._reader, "_buffer", None))

    def receive_ready(self) -> Message | None:
        """The next received message if one is waiting already, else None (never waits)."""
        return self._received.get_nowait()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    def close(self, reason: str | None = None) -> None:
        """Close now; ``reason`` (a protocol error, a slow peer) is logged once.

        A clean close lets the socket flush what was written. A close with a reason drops
        unsent bytes at once instead: the peer is misbehaving or not reading, and waiting
        for it to take them would pin the buffer and the socket for as long as it likes.
        """
        if self._closed.is_set():
            return
        self._close_reason = reason
        self._closed.set()
        if reason:
            log.warning(
                "chatter connection %s closed: %s",
                self.peer,
                reason,
                extra={"peer": self.peer, "reason": reason},
            )
            self._writer.transport.abort()
        else:
            self._writer.close()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        closed = f"connection to {self.peer} closed" + (f": {reason}" if reason else "")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionClosed(closed))
        self._received.end()

    async def aclose(self) -> None:
        """Close and wait until the socket and the tasks are done.

        Unsent bytes get :data:`_CLOSE_FLUSH_SECONDS` to reach a peer that reads; a peer
        that does not read then loses them, so closing never hangs on it.
        """
        self.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            async with asyncio.timeout(_CLOSE_FLUSH_SECONDS):
                await self._writer.wait_closed()
        except TimeoutError:
            self._writer.transport.abort()
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass

    async def _read_loop(self) -> None:
        reason: str | None = None
        heard = False
        try:
            while True:
                try:
                    frame = await read_frame(self._reader, self._max_frame_bytes, self._progress)
                except FrameTooLarge as too_large:
                    await self._skip_oversize_reply(too_large)
                    heard = True
                    continue
                heard = True
                self._progress.busy = True
                await self._dispatch(frame)
                self._progress.busy = False
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                reason = f"truncated frame ({len(exc.partial)} of {exc.expected} bytes)"
            elif self._to_server and self.secure and not heard:
                # asyncio drops a refused TLS 1.3 client's connection without the alert
                # that would say why: say what it most likely means.
                reason = (
                    "the server closed the TLS connection before sending anything: it may "
                    "require a client certificate (mutual TLS) and refuse ours, or our lack "
                    "of one; its log says why"
                )
        except ProtocolError as exc:
            reason = f"protocol error: {exc}"
        except ssl.SSLError as exc:
            # After the handshake: the peer refused us late (TLS 1.3 checks a client's
            # certificate after the client's handshake is done) or broke the TLS stream.
            reason = f"TLS: {exc.reason or exc}"
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            return
        self.close(reason)

    async def _skip_oversize_reply(self, too_large: FrameTooLarge) -> None:
        """Read past an oversize reply to one of our requests and fail that request with
        :class:`ReplyTooLarge`: the peer answered what was asked, so the connection is kept.
        Any other oversize frame raises ``too_large`` (the connection closes)."""
        if not self._pending:
            raise too_large
        head, left = await read_oversize_head(self._reader, too_large)
        future = None if head.owner else self._pending.get(head.first)
        if (
            future is None
            or future.done()
            or head.type not in codec.MESSAGE_TYPES.get(head.module or "", ())
        ):
            raise too_large
        await skip_frame(self._reader, left, self._progress)
        reason = (
            f"{head.module}.{head.type} of {too_large.size} bytes from {self.peer} exceeds "
            f"max_frame_bytes ({too_large.limit} bytes): the reply was dropped and the "
            "connection kept; ask for less at a time (pages) or raise max_frame_bytes"
        )
        extra = {"peer": self.peer, "bytes": too_large.size, "limit": too_large.limit}
        log.warning("chatter: %s", reason, extra=extra)
        future.set_exception(ReplyTooLarge(reason))

    async def _dispatch(self, frame: bytes | bytearray) -> None:
        received = envelope.parse(frame)
        module, type_name = received.module, received.type
        if module not in codec.MESSAGE_TYPES or type_name not in codec.MESSAGE_TYPES[module]:
            raise ProtocolError(f"unknown message type {module}.{type_name}")
        # The conversation as seen from here: ours if the sender is not its owner.
        conversation = Conversation(owner=not received.owner, first_id=received.first)
        if module == codec.PING:
            self._on_ping(type_name, conversation)
            return
        body = received.body
        message = Message(
            conversation=conversation,
            first=received.owner and received.first == received.id,
            last=received.last,
            module=module,
            type=type_name,
            # A small body (nearly every message) decoded here, without a coroutine.
            data=codec.decode(module, type_name, body, from_server=self._to_server)
            if len(body) <= INLINE_DECODE_BYTES
            else await decode_body(module, type_name, body, from_server=self._to_server),
        )
        if conversation.owner:
            future = self._pending.get(conversation.first_id)
            if future is not None and not future.done():
                future.set_result(message)
                return
        direct = self._direct
        if (
            direct is not None
            and self._received.awaited
            and not self._read_ahead
            and direct(message)
        ):
            return
        if not self._received.put_ready(message, len(frame)):
            await self._received.put(message, len(frame))

    def _on_ping(self, type_name: str, conversation: Conversation) -> None:
        if type_name == "MsgPing":
            self.send(codec.PING, "MsgPong", None, conversation=conversation, last=True)
        elif conversation.owner and conversation.first_id in self._pongs:
            self._pongs[conversation.first_id].set()

    async def _ping_loop(self, interval: float) -> None:
        try:
            while True:
                await asyncio.sleep(interval)
                pong = asyncio.Event()
                taken = self._progress.taken
                conversation = self.send(codec.PING, "MsgPing", None, last=False)
                self._pongs[conversation.first_id] = pong
                try:
                    async with asyncio.timeout(interval):
                        await pong.wait()
                except TimeoutError:
                    if self._received.paused:
                        # We stopped reading (backpressure): the reply may be waiting in the
                        # socket behind messages we have not taken yet; the peer is not idle.
                        continue
                    if self._streaming:
                        # Our ping still waits behind a streamed frame, whose writing closes
                        # a peer that stops reading (send_stream).
                        continue
                    if self._progress.taken != taken or self._progress.busy:
                        # The peer is sending a large frame (the reply waits behind it), or
                        # we are decoding one (the reply waits in the socket).
                        continue
                    self.close(f"no ping reply within {interval} s")
                    return
                finally:
                    self._pongs.pop(conversation.first_id, None)
        except (asyncio.CancelledError, ConnectionClosed):
            return


def certificate_identity(writer: asyncio.StreamWriter) -> str | None:
    """The subject common name (CN) of the certificate the peer presented and this side
    verified, or None (a plaintext link, no certificate, or one not verified: Python reports
    the certificate only once it is verified)."""
    certificate = writer.get_extra_info("peercert")
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
