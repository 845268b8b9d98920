"""A small Python subscriber of an intermediary, over :mod:`.transport`'s
WebSocket protocol, with the ``websockets`` library.

One background task reads the connection: JSON replies go to the request waiting for them
(requests are sent one at a time, and the server answers each in order), binary frames are
decoded (:func:`.generation.decode_frame`) into a bounded buffer that :meth:`frames`
iterates. The buffer keeps the latest frames: a caller slower than the server loses the
oldest (counted in :attr:`IntermediaryClient.overflowed`), as the server itself would drop
them. JSON messages of event and SQL-view subscriptions (``op`` ``event`` or ``view``) are a
stream: they are all kept, in order, for :meth:`IntermediaryClient.message`, and so are the
server's ``status`` messages (an upstream lost or back), in order with them;
:attr:`IntermediaryClient.stale` says which upstreams are stale now.

It proves who it is at the handshake with :class:`~.serving.credentials.Credentials` (a
token, or a user and password) and speaks TLS to a ``wss://`` URL, verifying the server's
certificate (against the system's CAs, or the context given). A refusal at the handshake is
an :class:`~tidings.errors.AccessRefused` with the server's status and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import websockets

from tidings.errors import AccessRefused, IntermediaryError, ProtocolError, SubscriptionRefused
from tidings.intermediary.client.subscriber import ReceivedFrame, Subscriber
from tidings.intermediary.node.generation import decode_frame
from tidings.intermediary.serving.credentials import Credentials
from tidings.intermediary.serving.envelope import open_envelope
from tidings.json_text import json_object


class IntermediaryClient(Subscriber):
    """A subscriber connected to one intermediary; use :meth:`connect` (``async with``
    closes it)."""

    def __init__(
        self,
        websocket: Any,
        subscriber: int,
        max_buffered: int,
        stale: dict[str, str] | None = None,
        identity: str = "",
    ) -> None:
        self.websocket = websocket
        self.subscriber = subscriber
        #: The identity the server took this client for (its hello says so).
        self.identity = identity
        #: The server's upstreams that are stale (name -> why), as its messages said so far.
        self.stale: dict[str, str] = dict(stale or {})
        self.overflowed = 0
        self.close_code: int | None = None
        self.close_reason: str | None = None
        #: Why this side closed the connection: a message from the server it could not read.
        self.error: ProtocolError | None = None
        self._frames: deque[ReceivedFrame] = deque(maxlen=max_buffered)
        self._frame_ready = asyncio.Event()
        self._replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._lock = asyncio.Lock()
        self._closed = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        max_buffered: int = 1024,
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
        **options: Any,
    ) -> IntermediaryClient:
        """Connect to ``url`` (``ws://host:port/``, or ``wss://`` over TLS: verified with
        ``tls``, default the system's CAs) with ``credentials`` (None: anonymous) and wait
        for the server's hello. Other ``options`` go to ``websockets.connect``."""
        if credentials is not None:
            options["additional_headers"] = credentials.headers()
        if tls is not None:  # websockets refuses it with a ws:// URL, saying so
            options["ssl"] = tls
        try:
            websocket = await websockets.connect(url, **options)
        except websockets.InvalidStatus as exc:
            raise refusal(url, exc) from None
        try:
            hello = json_object(f"client: {url}", await websocket.recv())
        except ProtocolError:
            await websocket.close(1002, "the hello is not JSON")
            raise
        if hello.get("op") != "hello":
            await websocket.close()
            raise IntermediaryError(f"client: expected a hello, got {hello!r}")
        return cls(
            websocket,
            int(hello["subscriber"]),
            max_buffered,
            hello.get("stale"),
            str(hello.get("identity", "")),
        )

    async def _subscribe_region(self, key: str, request: dict[str, Any]) -> dict[str, Any]:
        """A refusal raises :class:`IntermediaryError` with the server's message."""
        return await self.request(request)

    async def subscribe_events(self, key: str, patterns: list[list[str]]) -> dict[str, Any]:
        """Subscribe (or replace) ``key`` to the events whose types match ``patterns``."""
        return await self.request({"op": "subscribe", "key": key, "events": patterns})

    async def subscribe_sql(
        self, key: str, sql: str, *, priority: float = 0.0, rate_hz: float = 10.0
    ) -> dict[str, Any]:
        """Subscribe (or replace) ``key`` to the rows of the view ``sql``."""
        return await self.request(
            {"op": "subscribe", "key": key, "sql": sql, "priority": priority, "rate_hz": rate_hz}
        )

    async def message(self, timeout: float | None = None) -> dict[str, Any]:
        """The next event or view message (TimeoutError after ``timeout`` s; an
        :class:`IntermediaryError` once the connection closed and none is left)."""
        if not self._messages.empty():
            return self._messages.get_nowait()
        if self._closed.is_set():
            raise self._closed_error()
        getter = asyncio.ensure_future(self._messages.get())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait(
                {getter, closed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            closed.cancel()
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        if self._closed.is_set():
            raise self._closed_error()
        raise TimeoutError(f"client: no message within {timeout} s")

    async def unsubscribe(self, key: str) -> dict[str, Any]:
        return await self.request({"op": "unsubscribe", "key": key})

    async def request(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request and wait for its reply (an error reply raises)."""
        async with self._lock:
            await self.websocket.send(json.dumps(request))
            reply_task = asyncio.ensure_future(self._replies.get())
            closed_task = asyncio.ensure_future(self._closed.wait())
            await asyncio.wait({reply_task, closed_task}, return_when=asyncio.FIRST_COMPLETED)
            closed_task.cancel()
            if not reply_task.done():
                reply_task.cancel()
                raise self._closed_error()
            reply = reply_task.result()
        if reply.get("op") == "error":
            refused = reply.get("refused") is True
            raise (SubscriptionRefused if refused else IntermediaryError)(str(reply.get("message")))
        return reply

    async def frames(self) -> AsyncIterator[ReceivedFrame]:
        """The frames as they arrive, until the connection closes."""
        while True:
            while self._frames:
                yield self._frames.popleft()
            if self._closed.is_set():
                return
            self._frame_ready.clear()
            waiter = asyncio.ensure_future(self._frame_ready.wait())
            closed = asyncio.ensure_future(self._closed.wait())
            await asyncio.wait({waiter, closed}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            closed.cancel()

    async def close(self) -> None:
        await self.websocket.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def _on_text(self, message: dict[str, Any]) -> None:
        """A JSON message from the server: here, the reply to the request waiting (a
        subclass that follows the cluster's pushed messages routes those elsewhere), or an
        event or view message of an event-type or SQL subscription, or a status."""
        if message.get("op") == "status":
            if message.get("stale"):
                self.stale[str(message.get("upstream"))] = str(message.get("reason"))
            else:
                self.stale.pop(str(message.get("upstream")), None)
        if message.get("op") in ("event", "view", "status"):
            self._messages.put_nowait(message)
        else:
            self._replies.put_nowait(message)

    def _closed_error(self) -> IntermediaryError | ProtocolError:
        """What a call meets once the connection is closed: the server's unreadable message
        if that closed it, else the close's code and reason."""
        if self.error is not None:
            return self.error
        return IntermediaryError(
            f"client: connection closed ({self.close_code} {self.close_reason})"
        )

    def _on_frame(self, frame: ReceivedFrame) -> None:
        """A decoded frame, in arrival order with :meth:`_on_text`: into the buffer."""
        if len(self._frames) == self._frames.maxlen:
            self.overflowed += 1
        self._frames.append(frame)
        self._frame_ready.set()

    async def _read(self) -> None:
        try:
            async for message in self.websocket:
                if isinstance(message, str):
                    try:
                        decoded = json_object("client: the server", message)
                    except ProtocolError as exc:
                        # a hostile or broken server: said once, to whoever waits next
                        self.error = exc
                        await self.websocket.close(1002, "a message was not JSON")
                        break
                    self._on_text(decoded)
                    continue
                key, data = open_envelope(message)
                header, ids, positions = decode_frame(data)
                self._on_frame(ReceivedFrame(key, header, ids, positions))
        except websockets.ConnectionClosed:
            pass
        finally:
            self.close_code = self.websocket.close_code
            self.close_reason = self.websocket.close_reason
            self._closed.set()


def refusal(url: str, exc: websockets.InvalidStatus) -> IntermediaryError:
    """The error of a handshake the server answered with an HTTP status: its reason (the
    body the server wrote), as an :class:`AccessRefused` for 401, 403 and 429 (an address
    refused for failing to log in too often: ``retry_after_s`` says for how long)."""
    response = exc.response
    reason = response.body.decode(errors="replace").strip()[:300] if response.body else ""
    reason = reason or response.reason_phrase
    if response.status_code in (401, 403, 429):
        retry_after = response.headers.get("Retry-After", "")
        return AccessRefused(
            response.status_code,
            f"client: {url} refused the connection: {reason}",
            retry_after_s=float(retry_after) if retry_after.isdigit() else None,
        )
    return IntermediaryError(f"client: {url} answered {response.status_code}: {reason}")
