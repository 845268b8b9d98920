"""The demo publisher served over the wire: a :class:`.simulation.Simulation` ticking and
sending each connected intermediary its batch, in the spatial feed's protocol
(:mod:`tidings.intermediary.feed.wire`). ``tidings intermediary simulate`` runs one, and so
do the fan-out measurement and the tests.

Why a tick is never queued behind another: a batch carries deletions relative to the one
before it, so batches cannot be dropped; instead the publisher computes a connection's batch
only when the previous one has left (:meth:`SimulationServer`'s tick skips that connection,
counted in :attr:`FeedConnection.skipped`), and the next one is relative to what was really
sent. A slow intermediary gets fewer, later ticks, and bounded memory at the publisher.

With ``tls`` (an :class:`ssl.SSLContext`, :meth:`tidings.config.tls.TlsServerConfig.context`) the
feed is served over TLS (``wss://``), and with that context's client CA only to
intermediaries presenting a certificate it signed (mutual TLS: how a publisher knows its
intermediaries). A client that does not complete the TLS handshake (plaintext to this
port, a certificate refused) is dropped by it; the others go on. Connections are accepted by
a :class:`~tidings.accept.GuardedListener`: at most ``max_connections_per_address`` at once
from one address, and over TLS a client silent for ``tls_handshake_timeout`` seconds is
closed before any TLS state is made for it (then the handshake has as long again); each
refusal is counted in :attr:`SimulationServer.refusals` and logged once per cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import ssl
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import websockets
from websockets.asyncio.server import Server, ServerConnection, serve

from tidings.accept import (
    DEFAULT_MAX_PER_ADDRESS,
    DEFAULT_TLS_HANDSHAKE_TIMEOUT,
    AcceptRules,
    GuardedListener,
    listen,
)
from tidings.errors import IntermediaryError
from tidings.intermediary.feed.wire import (
    MAX_CONTROL_BYTES,
    POLICY_CLOSE_CODE,
    boxes_of,
    close_reason,
    encode_batch,
    entities_of,
)
from tidings.intermediary.publisher.simulation import Simulation, SimulationFeed
from tidings.tasks import stop_task

log = logging.getLogger(__name__)


def apply_control(feed: SimulationFeed, text: str | bytes) -> None:
    """Apply one control message of an intermediary to its feed; an error names what is
    wrong (the caller closes the connection with it)."""
    if not isinstance(text, str):
        raise IntermediaryError("feed: an intermediary sends text (JSON) messages only")
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        raise IntermediaryError("feed: a control message must be JSON") from None
    if not isinstance(message, dict):
        raise IntermediaryError("feed: a control message must be a JSON object")
    op = message.get("op")
    dim = feed.simulation.dim
    if op == "subscribe":
        feed.subscribe(boxes_of(message, dim))
    elif op == "unsubscribe":
        feed.unsubscribe(boxes_of(message, dim))
    elif op == "follow":
        feed.follow(entities_of(message))
    else:
        raise IntermediaryError(f"feed: unknown op {op!r} (subscribe, unsubscribe, follow)")


class FeedConnection:
    """One intermediary connected to a :class:`SimulationServer`: its feed and socket."""

    def __init__(self, feed: SimulationFeed, websocket: ServerConnection) -> None:
        self.feed = feed
        self.websocket = websocket
        #: The send of the latest batch, while it has not left.
        self.sending: asyncio.Task[None] | None = None
        #: Ticks not sent because the previous batch had not left yet.
        self.skipped = 0

    @property
    def ready(self) -> bool:
        return self.sending is None or self.sending.done()


class SimulationServer:
    """A :class:`.simulation.Simulation` ticking at ``tick_hz`` and served to intermediaries
    over WebSocket (the module docstring's protocol); :meth:`start`, then :meth:`aclose`."""

    def __init__(
        self,
        simulation: Simulation,
        tick_hz: float = 10.0,
        tls: ssl.SSLContext | None = None,
        *,
        max_connections_per_address: int | None = DEFAULT_MAX_PER_ADDRESS,
        tls_handshake_timeout: float = DEFAULT_TLS_HANDSHAKE_TIMEOUT,
    ) -> None:
        if not (isinstance(tick_hz, int | float) and math.isfinite(tick_hz) and tick_hz > 0):
            raise IntermediaryError(f"feed: tick_hz must be a number > 0, not {tick_hz!r}")
        self.simulation = simulation
        self.tick_hz = float(tick_hz)
        self.tls = tls
        self.rules = AcceptRules(
            max_connections_per_address, None if tls is None else tls_handshake_timeout
        )
        self.tls_handshake_timeout = tls_handshake_timeout
        #: Connections closed at accept, by reason (:mod:`tidings.accept`'s).
        self.refusals: Counter[str] = Counter()
        self.connections: list[FeedConnection] = []
        #: Bytes of batches sent (the upstream bandwidth), headers included.
        self.bytes_sent = 0
        self.port = 0
        self._server: Server | None = None
        self._ticker: asyncio.Task[None] | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen and start ticking; the URL intermediaries connect to."""
        try:
            sock = listen(host, port)
        except OSError as exc:
            raise IntermediaryError(
                f"feed: cannot listen on {host}:{port}: {exc.strerror}"
            ) from None
        guard = GuardedListener(sock, self.rules, self._refused)
        tls: dict[str, Any] = {}
        if self.tls is not None:
            tls = {"ssl": self.tls, "ssl_handshake_timeout": self.tls_handshake_timeout}
        try:
            self._server = await serve(
                self._endpoint,
                sock=guard.handoff,
                max_size=MAX_CONTROL_BYTES,
                compression=None,
                ping_interval=None,
                **tls,
            )
        except BaseException:
            guard.close()
            raise
        self.port = guard.port
        self._ticker = asyncio.get_running_loop().create_task(self._tick())
        shown = f"[{host}]" if ":" in host else host
        return f"{'ws' if self.tls is None else 'wss'}://{shown}:{self.port}/"

    def _refused(self, reason: str, address: str) -> None:
        self.refusals[reason] += 1

    async def aclose(self) -> None:
        if self._ticker is not None:
            await stop_task(self._ticker)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _endpoint(self, websocket: ServerConnection) -> None:
        conn = FeedConnection(self.simulation.feed(), websocket)
        self.connections.append(conn)
        try:
            async for text in websocket:
                try:
                    apply_control(conn.feed, text)
                except IntermediaryError as exc:
                    log.warning("feed: refused an intermediary's message: %s", exc)
                    await websocket.close(POLICY_CLOSE_CODE, close_reason(exc))
                    return
        except websockets.ConnectionClosed:
            pass
        finally:
            self.connections.remove(conn)
            self.simulation.drop_feed(conn.feed)

    async def _tick(self) -> None:
        period = 1.0 / self.tick_hz
        next_at = time.monotonic()
        while True:
            # The simulation's step and the relevant sets are numpy passes that release the
            # GIL for most of their time: in a thread they overlap the sends.
            ready = []
            for conn in self.connections:  # each looked at once: a send may end meanwhile
                if conn.ready:
                    ready.append(conn)
                else:
                    conn.skipped += 1
            messages = await asyncio.to_thread(self._advance, period, [c.feed for c in ready])
            for conn, message in zip(ready, messages, strict=True):
                self.bytes_sent += len(message)
                conn.sending = asyncio.ensure_future(self._send(conn, message))
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def _advance(self, period: float, feeds: Sequence[SimulationFeed]) -> list[bytes]:
        self.simulation.step(period)
        dim = self.simulation.dim
        return [encode_batch(feed.batch(), dim, feed.applied) for feed in feeds]

    @staticmethod
    async def _send(conn: FeedConnection, message: bytes) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            await conn.websocket.send(message)
