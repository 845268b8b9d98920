"""The streams' HTTP and WebSocket transport: a Starlette application.

Each stream's path takes FTN3 requests both ways FutoIn's client sends them: ``POST`` with
one JSON request as the body (``Content-Type: application/futoin+json``), and a WebSocket
at the same URL carrying one JSON message per frame (text or binary), where the server's
pushes travel too. Every reply is ``application/futoin+json``, an error included, so the
caller always learns the FTN3 error name. One bad request (malformed, too large, nested too
deeply, unknown function, failing) is answered with its error and affects nothing else; it
is logged once per cause, not per request (:class:`~tidings.logs.OncePerCause`: a peer
repeating a bad request must not flood the log). A WebSocket's requests take their turns
in the order they came, so a consumer may send
``registerConsumer`` and ``readyToReceive`` without waiting between them; an ``addEvent``'s
turn ends once its event is queued for the engine (in order), so pipelined ones share
commits and their replies follow as they are stored. The replies to the server's pushes are
taken as they come, and reading pauses while :data:`MAX_QUEUED_REQUESTS` requests wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tidings.errors import ConnectionClosed, StreamError
from tidings.streams.protocol import ftn3
from tidings.streams.protocol.channel import Channel
from tidings.streams.service.functions import Deferred, RawJson, StreamService

log = logging.getLogger(__name__)

#: The refusals this module logs: malformed requests. (Failed logins and missing permissions
#: are counted and logged by the stream's refusals, :mod:`.refusals`; the protocol's other
#: errors, an unregistered consumer say, are its normal answers.)
_LOGGED_REFUSALS = frozenset({ftn3.INVALID_REQUEST})

MEDIA_TYPE = "application/futoin+json"
#: Requests of one WebSocket peer waiting their turn, at most; reading stops while full.
MAX_QUEUED_REQUESTS = 16


def build_app(services: Mapping[str, StreamService]) -> Starlette:
    """The application serving ``services`` by path."""
    routes: list[Any] = []
    for path, service in services.items():
        routes.append(Route(path, _http_endpoint(service), methods=["POST"]))
        routes.append(WebSocketRoute(path, _ws_endpoint(service)))
    return Starlette(routes=routes)


async def answer(
    service: StreamService, data: bytes, channel: Channel | None, secure: bool
) -> bytes | Awaitable[bytes]:
    """The encoded reply to one encoded request, or, when its work goes on after the
    request's turn (:class:`~tidings.streams.service.functions.Deferred`), what will give it."""
    rid = None
    try:
        if len(data) > service.config.max_request_bytes:
            raise StreamError(
                ftn3.INVALID_REQUEST,
                f"the request has {len(data)} bytes; this stream takes up to "
                f"{service.config.max_request_bytes}",
            )
        message = ftn3.decode(data)
        if isinstance(message.get("rid"), str):
            rid = message["rid"]
        request = ftn3.parse_request(message)
        result = await service.call(request, channel, secure)
    except StreamError as exc:
        return _refused(service, exc, rid)
    except RecursionError:  # the request's nesting, met past decoding
        return _refused(service, StreamError(ftn3.INVALID_REQUEST, ftn3.NESTED_TOO_DEEPLY), rid)
    except Exception as exc:
        return _failed(service, exc, rid)
    if isinstance(result, Deferred):
        return _reply_later(service, result, rid)
    return _reply(result, rid)


async def _reply_later(service: StreamService, deferred: Deferred, rid: str | None) -> bytes:
    try:
        return _reply(await deferred.result, rid)
    except StreamError as exc:
        return _refused(service, exc, rid)
    except Exception as exc:
        return _failed(service, exc, rid)


def _reply(result: Any, rid: str | None) -> bytes:
    if isinstance(result, RawJson):
        tail = b"}" if rid is None else b',"rid":"' + rid.encode() + b'"}'
        return b'{"r":' + result + tail
    return ftn3.result(result, rid)


def _refused(service: StreamService, exc: StreamError, rid: str | None) -> bytes:
    """The error reply to a request refused with ``exc``; a malformed request is logged once
    per stream and minute, with the count of the others."""
    if exc.name in _LOGGED_REFUSALS:
        service.problems.log(
            logging.WARNING,
            ("refused", exc.name),
            f"stream {service.name}: request refused: {exc.name}: {exc.description[:200]}",
            extra={"stream": service.name, "error": exc.name},
        )
    return ftn3.error(exc, rid)


def _failed(service: StreamService, exc: Exception, rid: str | None) -> bytes:
    """The InternalError reply to a request that failed on ``exc``, logged with its
    traceback once per place it failed at (a peer may repeat the request at will)."""
    service.problems.failure(
        f"stream {service.name}: request failed", exc, extra={"stream": service.name}
    )
    return ftn3.error(StreamError(ftn3.INTERNAL_ERROR, "the request failed"), rid)


def _http_endpoint(service: StreamService) -> Any:
    async def endpoint(request: HttpRequest) -> Response:
        body = bytearray()
        limit = service.config.max_request_bytes
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    break  # answer() refuses it by its size
        except ClientDisconnect:
            # The caller went away mid-request (a consumer killed, a network cut): there is
            # nobody to answer, and half a request must not be acted on.
            return Response(status_code=204)
        secure = _is_secure(service, request.scope, request.headers)
        reply = await answer(service, bytes(body), None, secure)
        if not isinstance(reply, bytes):
            reply = await reply
        return Response(reply, media_type=MEDIA_TYPE)

    return endpoint


def _ws_endpoint(service: StreamService) -> Any:
    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        peer = f"{websocket.client.host}:{websocket.client.port}" if websocket.client else "?"
        channel = Channel(websocket.send_bytes, websocket.close, peer)
        secure = _is_secure(service, websocket.scope, websocket.headers)
        requests: asyncio.Queue[bytes] = asyncio.Queue(MAX_QUEUED_REQUESTS)
        later: set[asyncio.Task[None]] = set()

        async def serve_in_order() -> None:
            while True:
                data = await requests.get()
                reply = await answer(service, data, channel, secure)
                if isinstance(reply, bytes):
                    await channel.send(reply)
                else:
                    later.add(task := asyncio.get_running_loop().create_task(send(reply)))
                    task.add_done_callback(later.discard)

        async def send(reply: Awaitable[bytes]) -> None:
            with contextlib.suppress(ConnectionClosed):
                await channel.send(await reply)

        worker = asyncio.get_running_loop().create_task(serve_in_order())
        try:
            while not worker.done():
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                data = message.get("bytes")
                if data is None:
                    data = (message.get("text") or "").encode()
                if not _is_reply(service, data, channel):
                    await requests.put(data)
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            channel.close()
            await service.channel_closed(channel)
            worker.cancel()
            for task in later:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await worker

    return endpoint


def _is_reply(service: StreamService, data: bytes, channel: Channel) -> bool:
    """Hand a reply to one of our calls to the channel; True if ``data`` was one."""
    try:
        message = ftn3.decode(data)
    except StreamError:
        return False  # answer() reports it
    if ftn3.is_request(message):
        return False
    try:
        channel.answer(ftn3.parse_reply(message))
    except StreamError as exc:
        service.problems.log(
            logging.WARNING,
            "bad reply",
            f"bad reply from a stream consumer: {exc}",
            extra={"peer": channel.peer},
        )
    return True


def _is_secure(
    service: StreamService, scope: Mapping[str, Any], headers: Mapping[str, str]
) -> bool:
    """FTN3's SecureChannel: TLS here, a trusted proxy's TLS, or a channel declared secure."""
    config = service.config
    if scope.get("scheme") in ("https", "wss") or config.secure_channel:
        return True
    return config.trust_proxy and headers.get("x-forwarded-proto", "").lower() == "https"
