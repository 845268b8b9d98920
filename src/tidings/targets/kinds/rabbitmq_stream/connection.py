"""One connection of the ``rabbitmq_stream`` target to RabbitMQ's stream protocol, through
rstream's low-level ``Client``.

Why not rstream's ``Producer``: it keeps one publisher per stream and numbers its messages
itself from the broker's last stored id, while exactly-once here needs the ids chosen (and
recorded in the outbox) before a message is sent, under one of several references per
stream (:mod:`tidings.outbox.stream_ids`). The ``Client`` speaks the protocol (login,
``declare_publisher``, ``query_publisher_sequence``, publish frames, confirms and errors)
and leaves those choices to the caller; this module adds the matching of each confirm or
error to the message it answers, and the failure of every waiting message when the
connection drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tidings.errors import TargetError
from tidings.redaction import hide_url_credentials
from tidings.targets.kinds.rabbitmq_stream.config import (
    TLS,
    RabbitMQStreamTargetConfig,
    server_address,
)
from tidings.targets.kinds.rabbitmq_stream.messages import FRAME_OVERHEAD, MESSAGE_OVERHEAD

if TYPE_CHECKING:
    from rstream import schema
    from rstream.client import Client

_log = logging.getLogger("tidings.targets.kinds.rabbitmq_stream")

#: The broker's answer to a message: 0 stored (or dropped as a duplicate), else the
#: response code of its publish error.
CONFIRMED = 0
#: Response codes of a publish error, named for messages.
RESPONSE_CODES = {
    2: "the stream does not exist",
    6: "the stream is not available",
    16: "access refused",
    18: "the publisher does not exist",
}


class ConnectionLost(TargetError):
    """The connection dropped while messages were waiting for their answers, or must be
    replaced (its publisher ids are used up); the target drops it and opens another."""


def describe(exc: BaseException) -> str:
    """Name the exception type too: rstream's errors often have empty texts."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class StreamConnection:
    """A logged-in stream-protocol connection, its publishers and their unanswered messages."""

    def __init__(self, config: RabbitMQStreamTargetConfig, name: str, tls: ssl.SSLContext | None):
        self.config = config
        self.name = name
        self._tls = tls
        self._timeout = config.confirm_timeout.total_seconds()
        self._client: Client | None = None
        self._publishers: dict[tuple[str, str], int] = {}
        self._next_publisher = 0
        self._waiting: dict[tuple[int, int], asyncio.Future[int]] = {}
        self.frame_max = config.frame_max

    @property
    def alive(self) -> bool:
        return self._client is not None and self._client.is_connection_alive()

    async def open(self) -> None:
        """Connect to the first broker that answers and log in; TargetError says why not."""
        from rstream import schema
        from rstream.client import Client

        causes: list[str] = []
        for server in self.config.servers:
            host, port, vhost = server_address(server)
            parts = urlsplit(server)
            user = self.config.username or parts.username or "guest"
            password = self.config.password
            if password is None:
                password = parts.password if parts.password is not None else "guest"
            client = Client(
                host,
                port,
                ssl_context=self._tls if parts.scheme == TLS else None,
                frame_max=self.config.frame_max,
                heartbeat=60,
                connection_name=f"tidings-{self.name}",
                connection_closed_handler=self._on_closed,
            )
            try:
                async with asyncio.timeout(self._timeout):
                    await client.start()
                    await client.authenticate(vhost, user, password)
            except Exception as exc:
                await _close_quietly(client)
                cause = "timed out" if isinstance(exc, TimeoutError) else describe(exc)
                causes.append(hide_url_credentials(f"{server}: {cause}"))
                continue
            client.add_handler(schema.PublishConfirm, self._on_confirm, name="tidings")
            client.add_handler(schema.PublishError, self._on_error, name="tidings")
            self._client = client
            self.frame_max = client.frame_max
            return
        raise TargetError(f"cannot connect ({'; '.join(causes)})")

    async def ensure_stream(self, stream: str) -> None:
        """Check that ``stream`` exists, creating it if so configured; TargetError if not."""
        client = self._live()
        async with asyncio.timeout(self._timeout):
            if await client.stream_exists(stream):
                return
            if not self.config.create_stream:
                raise TargetError(
                    f"stream {stream!r} does not exist (create it, or set create_stream)"
                )
            from rstream.exceptions import StreamAlreadyExists

            with contextlib.suppress(StreamAlreadyExists):  # another sender made it meanwhile
                await client.create_stream(stream)

    async def last_stored(self, stream: str, reference: str) -> int:
        """The broker's last stored publishing id for ``reference`` on ``stream`` (0: none)."""
        from rstream import schema

        client = self._live()
        async with asyncio.timeout(self._timeout):
            answer = await client.sync_request(
                schema.QueryPublisherSequence(
                    client._corr_id_seq.next(), publisher_ref=reference, stream=stream
                ),
                resp_schema=schema.QueryPublisherSequenceResponse,
                raise_exception=True,
            )
        return int(answer.sequence)

    async def declare(self, stream: str, reference: str) -> int:
        """The publisher id of ``reference`` on ``stream`` on this connection, declared once."""
        known = self._publishers.get((stream, reference))
        if known is not None:
            return known
        client = self._live()
        publisher_id = self._next_publisher
        if publisher_id > 255:  # the protocol's publisher id is one byte
            raise ConnectionLost(
                "the connection's 256 publisher ids are used up (many streams): it is replaced"
            )
        # Taken before the await: the senders of other streams declare theirs at the same
        # time, and the broker refuses an id twice on a connection. Never reused.
        self._next_publisher += 1
        async with asyncio.timeout(self._timeout):
            await client.declare_publisher(stream, reference, publisher_id)
        client.add_stream(stream)  # so that rstream reports the connection's loss
        self._publishers[(stream, reference)] = publisher_id
        return publisher_id

    def forget_publisher(self, stream: str, reference: str) -> None:
        """The broker no longer knows ``reference``'s publisher on ``stream`` (the stream was
        deleted, perhaps created again): declare it afresh when next used."""
        self._publishers.pop((stream, reference), None)

    async def publish(
        self, publisher_id: int, messages: Sequence[tuple[int, bytes]], deadline: float
    ) -> dict[int, int]:
        """Send ``messages`` (``(publishing id, data)``, ids ascending) in frames of at most
        ``frame_max`` and wait for their answers until ``deadline`` (``time.monotonic()``):
        publishing id -> :data:`CONFIRMED` or the error's response code, for those answered
        in time. :class:`ConnectionLost` if the connection dropped first, or if the frames
        could not all be written by ``deadline`` (the broker stopped reading): the connection
        is then reset, so that nothing more of them reaches the broker later, after the
        sender's lease on their reference can have run out. The same reset follows answers
        that did not all come by ``deadline``: the socket may still hold some of the
        messages."""
        from rstream import schema

        client = self._live()
        loop = asyncio.get_running_loop()
        futures = {pid: loop.create_future() for pid, _ in messages}
        for pid, future in futures.items():
            self._waiting[(publisher_id, pid)] = future
        until = loop.time() + max(deadline - time.monotonic(), 0.0)
        try:
            try:
                async with asyncio.timeout_at(until):
                    for frame in _frames(messages, self.frame_max):
                        await client.send_publish_frame(
                            schema.Publish(
                                publisher_id=publisher_id,
                                messages=[
                                    schema.Message(publishing_id=pid, filter_value=None, data=data)
                                    for pid, data in frame
                                ],
                            )
                        )
            except TimeoutError:
                self.reset()
                raise ConnectionLost(
                    "the broker did not take the messages in time (the connection was reset)"
                ) from None
            await asyncio.wait(futures.values(), timeout=max(until - loop.time(), 0.0))
        finally:
            for pid in futures:
                self._waiting.pop((publisher_id, pid), None)
        answers: dict[int, int] = {}
        for pid, future in futures.items():
            if not future.done():
                continue
            if future.exception() is not None:
                raise ConnectionLost(f"the connection dropped: {future.exception()}")
            answers[pid] = future.result()
        if len(answers) < len(futures):
            if not self.alive:
                raise ConnectionLost("the connection dropped")
            self.reset()  # what is still in the socket must not reach the broker later
        return answers

    def reset(self) -> None:
        """Drop the connection at once, discarding what is not yet sent: the bytes waiting in
        this process and in the socket's send buffer (a TCP reset, not a close, which would
        still deliver them)."""
        client = self._client
        if client is None:
            return
        client._is_not_closed = False  # rstream's own mark of a dead connection: not alive
        self._fail_waiting("the connection was reset")
        writer = getattr(getattr(client, "_conn", None), "_writer", None)
        if writer is None:
            return
        sock = writer.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def close(self) -> None:
        """Close the connection; never raise."""
        client, self._client = self._client, None
        self._publishers.clear()
        self._fail_waiting("the connection was closed")
        if client is not None:
            await _close_quietly(client)

    def _live(self) -> Client:
        if self._client is None or not self._client.is_connection_alive():
            raise ConnectionLost("not connected")
        return self._client

    def _on_confirm(self, frame: schema.PublishConfirm) -> None:
        for pid in frame.publishing_ids:
            future = self._waiting.get((frame.publisher_id, pid))
            if future is not None and not future.done():
                future.set_result(CONFIRMED)

    def _on_error(self, frame: schema.PublishError) -> None:
        for error in frame.errors:
            future = self._waiting.get((frame.publisher_id, error.publishing_id))
            if future is not None and not future.done():
                future.set_result(error.response_code or -1)

    def _on_closed(self, info: Any) -> None:
        self._fail_waiting(f"the broker closed the connection ({info})")

    def _fail_waiting(self, why: str) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionLost(why))


def _frames(messages: Sequence[tuple[int, bytes]], frame_max: int) -> list[list[tuple[int, bytes]]]:
    """``messages`` cut into publish frames of at most ``frame_max`` bytes, in order."""
    frames: list[list[tuple[int, bytes]]] = []
    size = FRAME_OVERHEAD
    for pid, data in messages:
        item = MESSAGE_OVERHEAD + len(data)
        if frames and frames[-1] and size + item <= frame_max:
            frames[-1].append((pid, data))
            size += item
        else:
            frames.append([(pid, data)])
            size = FRAME_OVERHEAD + item
    return frames


async def _close_quietly(client: Client) -> None:
    try:
        async with asyncio.timeout(3):
            await client.close()
    except Exception as exc:  # a broken connection has nothing left to close
        _log.debug("rabbitmq_stream target: closing: %s", describe(exc))
