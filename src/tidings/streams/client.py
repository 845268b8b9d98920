"""An asyncio consumer of FTN18 streams (tidings' or any FTN18 generator's).

:class:`StreamClient` makes single calls over HTTP (``addEvent``, ``registerConsumer``,
``pollEvents``). :func:`consume` runs a consumer until cancelled, by polling or by push:

- polling sends the last handled id with each poll (the acknowledgement), and waits between
  polls adaptively: not at all while replies come full, a little after a partial one, and
  doubling up to ``max_delay`` while they come empty; cancelled, it acknowledges what it
  handled before it stops;
- push opens a WebSocket, registers, calls ``readyToReceive`` and handles each
  ``onEvents`` group in seq order, however the groups arrive, replying only once the
  handler has returned for every event of the group: the reply is the acknowledgement, so
  an event whose handler did not finish comes again after a reconnect. A live consumer is
  told of the seq gaps that mark skipped groups (``on_gap``).

Both reconnect after a failure with a growing delay and resume where the server has the
consumer; a live consumer resumes at the newest events. Given the URLs of several servers
of a redundant group, a consumer moves to the next one on a lost connection (at once, the
delay growing only once every one has failed): the group shares the consumers' positions
(:mod:`tidings.streams.consumers.replication`), so it resumes from its last acknowledged
position there. A polling consumer sends no ``last_id`` to a server before that server has
answered it (an id is one server's own number); what it handled but had not acknowledged
comes again. Errors the server names arrive as :class:`~tidings.errors.StreamError` with
the FutoIn error name.

Over ``https://`` (and ``wss://``) the server's certificate is verified: against the system's
CAs, or the CA of an :class:`ssl.SSLContext` passed as ``tls`` (for a private CA;
:meth:`tidings.config.tls.TlsClientConfig.context` makes one from files).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import websockets

from tidings.errors import ConnectionClosed, StreamError
from tidings.json_text import json_object
from tidings.streams.protocol import ftn3

log = logging.getLogger(__name__)

LIVE = "LIVE"
_MEDIA_TYPE = "application/futoin+json"
_VERSION = "1.1"
#: The largest frame the consumer takes (onEvents of receiver 1.1 may be 8 MiB).
_MAX_FRAME = 8 * 1024 * 1024 + 4096
_FULL_POLL = 1000


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One FTN18 event: ``id`` as an integer, ``ts`` as FTN18 writes it."""

    id: int
    type: str
    data: Any
    ts: str

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> StreamEvent:
        return cls(int(raw["id"]), raw["type"], raw.get("data"), raw["ts"])

    def as_dict(self) -> dict[str, Any]:
        return {"id": str(self.id), "type": self.type, "data": self.data, "ts": self.ts}


Handler = Callable[[StreamEvent], Awaitable[None]]


class StreamClient:
    """FTN18 calls over HTTP to one stream endpoint (``http://`` or ``https://``)."""

    def __init__(
        self,
        url: str,
        user: str,
        password: str,
        *,
        timeout: float = 30.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.url = http_url(url)
        self._sec = f"{user}:{password}"
        # ``tls``: how an https:// server is verified (None: the system's CAs)
        self._http = httpx.AsyncClient(timeout=timeout, verify=True if tls is None else tls)

    async def call(self, iface: str, func: str, params: dict[str, Any]) -> Any:
        """One call; its result, or StreamError with the server's error name."""
        body = ftn3.request(f"{iface}:{_VERSION}:{func}", params, None, self._sec)
        try:
            response = await self._http.post(
                self.url, content=body, headers={"Content-Type": _MEDIA_TYPE}
            )
        except httpx.HTTPError as exc:
            raise ConnectionClosed(f"stream {self.url}: {type(exc).__name__}: {exc}") from exc
        return ftn3_outcome(self.url, response)

    async def register(self, component: str) -> None:
        await self.call("futoin.evt.poll", "registerConsumer", {"component": component})

    async def poll(
        self, component: str, last_id: int | None = None, want: Sequence[str] | None = None
    ) -> list[StreamEvent]:
        """The events after the consumer's position; ``last_id`` acknowledges first."""
        params = {
            "component": component,
            "last_id": None if last_id is None else str(last_id),
            "want": None if want is None else list(want),
        }
        raw = await self.call("futoin.evt.poll", "pollEvents", params)
        return [StreamEvent.from_wire(item) for item in raw]

    async def add_event(self, event_type: str, data: Any) -> int:
        """Generate one event (the stream must allow it over this channel); its id."""
        return int(
            await self.call("futoin.evt.gen", "addEvent", {"type": event_type, "data": data})
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> StreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@dataclass(frozen=True)
class _Consumption:
    """What :func:`consume` was asked for, handed to the poll or push loop."""

    user: str
    password: str
    component: str
    handler: Handler
    want: Sequence[str] | None
    on_gap: Callable[[int, int], None] | None
    on_ready: Callable[[], None] | None
    max_delay: float
    tls: ssl.SSLContext | None = None

    def ready(self) -> None:
        if self.on_ready is not None:
            self.on_ready()


async def consume(
    url: str | Sequence[str],
    user: str,
    password: str,
    component: str,
    handler: Handler,
    *,
    want: Sequence[str] | None = None,
    push: bool = True,
    on_gap: Callable[[int, int], None] | None = None,
    max_delay: float = 1.0,
    on_ready: Callable[[], None] | None = None,
    connect_timeout: float | None = None,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Consume a stream until cancelled (see the module docstring); ``component`` LIVE
    consumes live; ``tls`` verifies ``https://`` servers (None: the system's CAs). ``url`` is
    the stream's URL, or those of the servers of a group. Errors that retrying cannot fix
    (SecurityError, NotRegistered, InvalidRequest, an endpoint that is not a stream, …) are
    raised.

    Connection failures are retried. Before the stream has been reached, for at most
    ``connect_timeout`` seconds (None: for ever), a slow answer included: a stream never
    reached is a ConnectionClosed naming the URL and why. Once it has been reached, a lost
    connection is retried for ever (the server may be restarting), and said: one warning
    when it is lost, one when it is reached again, however many tries lie between.
    """
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise StreamError("InvalidRequest", "consume: no stream URL given")
    for each in urls:
        http_url(each)  # a malformed URL is refused now, not at its turn
    state = _Connection(urls, on_ready, connect_timeout)
    asked = _Consumption(
        user, password, component, handler, want, on_gap, state.ready, max_delay, tls
    )
    while True:
        try:
            async with state.attempt():
                await (_push(asked, state.url) if push else _poll_loop(asked, state.url))
        except (ConnectionClosed, OSError, websockets.ConnectionClosed) as exc:
            await asyncio.sleep(state.failed(exc))


class _Connection:
    """Whether :func:`consume` has reached its stream, and what a failed try means: before
    it first did, a failure at the connect deadline is final; after, a lost connection is
    reported once and retried. Each failure moves to the next URL at once; once every URL
    has failed in turn, tries are spaced by a delay doubling up to 5 s."""

    #: A try begun just before the deadline gets this long to be answered.
    LAST_TRY = 1.0

    def __init__(
        self, urls: list[str], on_ready: Callable[[], None] | None, connect_timeout: float | None
    ) -> None:
        self._urls = urls
        self._index = 0
        self._failed_in_turn = 0
        self._on_ready = on_ready
        self._connect_timeout = connect_timeout
        self._clock = asyncio.get_running_loop().time
        self._deadline = None if connect_timeout is None else self._clock() + connect_timeout
        self._scope: asyncio.Timeout | None = None
        self._cut = False  # the last try was cut at the connect deadline
        self._delay = 0.1
        self.reached = False
        self.lost = False

    @contextlib.asynccontextmanager
    async def attempt(self) -> AsyncIterator[None]:
        """One try, cut at the connect deadline while the stream has never been reached (a
        server that accepts but does not answer must not hold the consumer past it)."""
        cut_at = None
        if not self.reached and self._deadline is not None:
            cut_at = max(self._deadline, self._clock() + self.LAST_TRY)
        scope = self._scope = asyncio.timeout_at(cut_at)
        try:
            async with scope:
                yield
        finally:
            self._cut = scope.expired()
            self._scope = None

    @property
    def url(self) -> str:
        """The URL of the server to try now."""
        return self._urls[self._index]

    def ready(self) -> None:
        """The stream answered: registered (reliable) and ready to receive."""
        self._failed_in_turn = 0
        if self._scope is not None:
            self._scope.reschedule(None)  # reached: no deadline on this connection
        if self.lost:
            log.warning("stream reached again", extra={"url": self.url})
        self.reached, self.lost = True, False
        if self._on_ready is not None:
            self._on_ready()

    def failed(self, exc: BaseException) -> float:
        """A try failed with a connection error: the seconds to wait before the next, or
        ConnectionClosed for a stream never reached once its deadline has passed."""
        failed_url = self.url
        self._index = (self._index + 1) % len(self._urls)
        self._failed_in_turn += 1
        if self._failed_in_turn < len(self._urls):
            delay = 0.0  # another server to try: at once
        else:
            self._failed_in_turn = 0
            delay, self._delay = self._delay, min(self._delay * 2, 5.0)
        if self.reached:
            if not self.lost:
                log.warning(
                    "stream connection lost; reconnecting until it is back",
                    extra={"url": failed_url, "next": self.url, "error": failure_reason(exc)},
                )
            else:
                log.debug("stream still unreachable", extra={"error": failure_reason(exc)})
            self.lost = True
            return delay
        left = delay if self._deadline is None else self._deadline - self._clock()
        if left <= 0:
            why = (
                f"no answer within {self._connect_timeout:g} s"
                if self._cut
                else failure_reason(exc)
            )
            raise ConnectionClosed(
                f"cannot reach stream {' nor '.join(self._urls)}: {why}"
            ) from None
        log.info("stream not reachable yet; retrying", extra={"error": failure_reason(exc)})
        return min(delay, left)


def failure_reason(exc: BaseException) -> str:
    """Why a connection failed, in a few words (``connection refused``): from the OS error
    at the bottom of the exception's chain where there is one, else from the HTTP client's
    error (``RemoteProtocolError: Server disconnected …``)."""
    http_error: httpx.HTTPError | None = None
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, TimeoutError | httpx.TimeoutException):
            return "timed out"
        if isinstance(cause, ssl.SSLError):
            return f"TLS handshake failed: {cause.strerror or cause}"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror[:1].lower() + cause.strerror[1:]
        if isinstance(cause, httpx.HTTPError) and http_error is None:
            http_error = cause
        cause = cause.__cause__ or cause.__context__
    if http_error is not None:
        return f"{type(http_error).__name__}: {http_error}".rstrip(": ")
    return str(exc) or type(exc).__name__


async def _poll_loop(asked: _Consumption, url: str) -> None:
    component, want = asked.component, asked.want
    async with StreamClient(url, asked.user, asked.password, tls=asked.tls) as client:
        if component != LIVE:
            await client.register(component)
        asked.ready()
        last_id: int | None = None
        acknowledged: int | None = None
        delay = 0.0
        try:
            while True:
                events = await client.poll(component, last_id, want)
                acknowledged = last_id
                for event in events:
                    await asked.handler(event)
                    last_id = event.id
                if len(events) >= _FULL_POLL:
                    delay = 0.0
                elif events:
                    delay = 0.01
                else:
                    delay = min(max(delay * 2, 0.02), asked.max_delay)
                if delay:
                    await asyncio.sleep(delay)
        except asyncio.CancelledError:
            if component != LIVE and last_id is not None and last_id != acknowledged:
                # Stopped: acknowledge what was handled (the events this poll returns come
                # again to the next consumer of the component).
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2.0):
                        await client.poll(component, last_id, want)
            raise


async def _push(asked: _Consumption, url: str) -> None:
    sec = f"{asked.user}:{asked.password}"
    component = asked.component
    try:
        address = ws_url(url)
        # websockets refuses an ssl context with a ws:// URL, and ssl=None with a wss:// one
        options: dict[str, Any] = {}
        if asked.tls is not None and address.startswith("wss:"):
            options["ssl"] = asked.tls
        connection = await websockets.connect(
            address, max_size=_MAX_FRAME, compression=None, **options
        )
    except websockets.InvalidStatus as exc:
        raise StreamError(
            "InternalError",
            f"stream {ws_url(url)}: HTTP {exc.response.status_code}, not a stream's "
            "WebSocket endpoint",
        ) from None
    except websockets.InvalidHandshake as exc:
        raise StreamError(
            "InternalError", f"stream {ws_url(url)}: not a WebSocket endpoint: {exc}"
        ) from None
    async with connection as ws:
        receiver = _Receiver(ws, asked.handler, asked.on_gap, live=component == LIVE, url=address)
        calls = 0

        async def call(func: str, params: dict[str, Any]) -> None:
            nonlocal calls
            calls += 1
            rid = f"C{calls}"
            await ws.send(ftn3.request(f"futoin.evt.push:{_VERSION}:{func}", params, rid, sec))
            await receiver.wait_reply(rid)

        reading = asyncio.create_task(receiver.read())
        try:
            if component != LIVE:
                await _racing(call("registerConsumer", {"component": component}), reading)
            want = None if asked.want is None else list(asked.want)
            await _racing(call("readyToReceive", {"component": component, "want": want}), reading)
            asked.ready()
            await reading
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reading


async def _racing(call: Awaitable[None], reading: asyncio.Task[None]) -> None:
    """Await ``call`` unless the reader ends first (then its error is raised)."""
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task, reading}, return_when=asyncio.FIRST_COMPLETED)
    if task not in done:
        task.cancel()
        reading.result()
        raise ConnectionClosed("the stream closed the connection")
    task.result()


class _Receiver:
    """Reads the consumer's socket: replies to its calls, and onEvents groups handled in seq
    order."""

    def __init__(
        self,
        ws: Any,
        handler: Handler,
        on_gap: Callable[[int, int], None] | None,
        live: bool,
        url: str = "",
    ) -> None:
        self._ws = ws
        self._url = url
        self._handler = handler
        self._on_gap = on_gap
        self._live = live
        self._replies: dict[str, asyncio.Future[Any]] = {}
        self._groups: dict[int, tuple[str | None, list[StreamEvent]]] = {}
        self._next_seq: int | None = 0 if not live else None
        self._handling: asyncio.Task[None] | None = None

    async def wait_reply(self, rid: str) -> Any:
        future = self._replies[rid] = asyncio.get_running_loop().create_future()
        return await future

    async def read(self) -> None:
        try:
            async for frame in self._ws:
                message = json_object(f"stream {self._url}", frame)
                if "f" in message:
                    self._on_call(message)
                else:
                    future = self._replies.pop(str(message.get("rid")), None)
                    if future is not None and not future.done():
                        try:
                            future.set_result(ftn3.outcome(message))
                        except StreamError as exc:
                            future.set_exception(exc)
        finally:
            if self._handling is not None:
                self._handling.cancel()
        raise ConnectionClosed("the stream closed the connection")

    def _on_call(self, message: dict[str, Any]) -> None:
        rid = message.get("rid")
        if not str(message.get("f", "")).endswith(":onEvents"):
            log.warning("stream called %s, which a consumer does not serve", message.get("f"))
            return
        params = message.get("p", {})
        seq = int(params["seq"])
        events = [StreamEvent.from_wire(raw) for raw in params["events"]]
        self._groups[seq] = (rid, events)
        if self._handling is None or self._handling.done():
            self._handling = asyncio.ensure_future(self._handle_ready())

    async def _handle_ready(self) -> None:
        """Handle the groups that are next in seq order; each reply after its handlers."""
        while self._groups:
            if self._next_seq is None:  # live: start at the first group seen
                self._next_seq = min(self._groups)
            seq = self._next_seq
            if seq not in self._groups:
                if not self._live or not self._groups:
                    return  # an earlier group is still on its way
                newer = min(self._groups)
                if self._on_gap is not None:
                    self._on_gap(seq, newer)
                seq = newer
            rid, events = self._groups.pop(seq)
            for event in events:
                await self._handler(event)
            await self._ws.send(ftn3.result(True, rid))
            self._next_seq = seq + 1


def ftn3_outcome(url: str, response: httpx.Response) -> Any:
    """The result of an FTN3 call answered by ``response``, StreamError with the server's
    error name, or InternalError naming the HTTP status of an answer that is not FTN3 (a
    path that is no stream, a proxy's error page)."""
    if not response.headers.get("content-type", "").startswith("application/futoin+"):
        raise StreamError("InternalError", f"stream {url}: HTTP {response.status_code}, not FTN3")
    return ftn3.outcome(json_object(f"stream {url}", response.content))


def http_url(url: str) -> str:
    """``url`` with an HTTP scheme (``ws`` becomes ``http``, ``wss`` becomes ``https``)."""
    return _with_scheme(url, {"ws": "http", "wss": "https", "http": "http", "https": "https"})


def ws_url(url: str) -> str:
    """``url`` with a WebSocket scheme."""
    return _with_scheme(url, {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"})


def _with_scheme(url: str, schemes: dict[str, str]) -> str:
    """``url`` with its scheme mapped by ``schemes``, or InvalidRequest naming what is wrong
    with it (checked here, where it is given, rather than met as a traceback deep in the
    HTTP or WebSocket client: a bracket left open, a port past 65535)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
        if parts.scheme not in schemes:
            raise ValueError("its scheme must be http, https, ws or wss")
        if not parts.hostname:
            raise ValueError("it names no host")
    except ValueError as exc:
        raise StreamError("InvalidRequest", f"{url!r} is not a stream URL: {exc}") from None
    return urlunsplit(parts._replace(scheme=schemes[parts.scheme]))
