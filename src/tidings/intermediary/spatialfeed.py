"""The spatial upstream over the wire: a publisher of moving entities and the intermediaries
that subscribe to it in other processes (the patent's intermediaries are separate machines,
Fig. 3; issue 12 items 5-7).

One WebSocket connection per intermediary. The intermediary sends JSON text messages, in
order, with the :class:`.process.Upstream` operations:

* ``{"op": "subscribe", "boxes": [{"lo": [x, y], "hi": [x, y]}, ...]}``
* ``{"op": "unsubscribe", "boxes": [...]}`` (one occurrence of each; the boxes are a multiset)
* ``{"op": "follow", "entities": [id, ...]}`` (int64 ids, replacing the set followed)

The publisher sends one binary message per tick (:func:`encode_batch`): a 40-byte header
``<4sBBHQQdII`` (magic ``TSFB``, version 1, dimension, reserved, tick u64, *applied* u64:
how many of the intermediary's operations the batch reflects, the tick's wall-clock time
f64, ``n`` upserts, ``m`` deletions) then ``n`` int64 ids, ``n * dim`` float64 positions and
``m`` int64 deleted ids, little-endian: the intermediary's state holds exactly what its
boxes (and followed entities) cover. Why *applied*: an operation reaches the publisher a
tick or more after the intermediary sent it, so a new subscription's part of the world is
not in the next batch; the intermediary does not serve a view until the batches reflect
the operation its subscription needed (:func:`.process.requests_of`), rather than serve it
from state that lacks part of it. A malformed message or a refused
operation closes the connection with code 1008 and a reason naming the problem; the
publisher goes on serving the others.

Why a tick is never queued behind another: a batch carries deletions relative to the one
before it, so batches cannot be dropped; instead the publisher computes a connection's batch
only when the previous one has left (:meth:`SimulationServer`'s tick skips that connection,
counted in :attr:`FeedConnection.skipped`), and the next one is relative to what was really
sent. A slow intermediary gets fewer, later ticks, and bounded memory at the publisher.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import websockets
from websockets.asyncio.server import Server, ServerConnection, serve

from tidings.errors import IntermediaryError
from tidings.intermediary.coverage import UpstreamPolicy
from tidings.intermediary.geometry import Box
from tidings.intermediary.process import Intermediary
from tidings.intermediary.scheduling import Scheduler
from tidings.intermediary.simulation import MAX_FEED_BOXES, Simulation, SimulationFeed
from tidings.intermediary.state import UpdateBatch

log = logging.getLogger(__name__)

HEADER = struct.Struct("<4sBBHQQdII")
MAGIC = b"TSFB"
VERSION = 1
#: The close code of a refused operation or a malformed message (policy violation).
POLICY_CLOSE_CODE = 1008
#: The largest control message an intermediary may send (a full box set fits easily).
MAX_CONTROL_BYTES = 1 << 20
#: The most entities one connection may follow.
MAX_FOLLOWED = 100_000


def encode_batch(batch: UpdateBatch, dim: int, applied: int = 0) -> bytes:
    """One tick's binary message (see the module docstring); ``applied``: the operations of
    the intermediary the batch reflects."""
    ids = np.ascontiguousarray(batch.ids, dtype="<i8")
    positions = np.ascontiguousarray(
        np.empty((0, dim)) if batch.positions is None else batch.positions, dtype="<f8"
    )
    delete = np.ascontiguousarray(batch.delete, dtype="<i8")
    if positions.shape != (len(ids), dim):
        raise IntermediaryError(
            f"feed: {len(ids)} ids need positions of shape ({len(ids)}, {dim}), "
            f"not {positions.shape}"
        )
    tick = 0 if batch.tick is None else batch.tick
    for name, value in (("tick", tick), ("applied", applied)):
        if not 0 <= value < 2**64:
            raise IntermediaryError(f"feed: a batch's {name} must be in [0, 2**64), not {value}")
    if not math.isfinite(batch.tick_time):
        raise IntermediaryError("feed: a batch's tick time must be finite")
    head = HEADER.pack(
        MAGIC, VERSION, dim, 0, tick, applied, batch.tick_time, len(ids), len(delete)
    )
    return b"".join((head, ids.tobytes(), positions.tobytes(), delete.tobytes()))


def decode_batch(data: bytes, dim: int) -> tuple[UpdateBatch, int]:
    """The :class:`UpdateBatch` of one tick's message and the operations it reflects; a
    malformed one is an error naming what is wrong."""
    if len(data) < HEADER.size:
        raise IntermediaryError(f"feed: a batch of {len(data)} bytes is shorter than its header")
    magic, version, got_dim, _, tick, applied, tick_time, n, m = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise IntermediaryError(f"feed: not a version {VERSION} batch ({magic!r} v{version})")
    if got_dim != dim:
        raise IntermediaryError(f"feed: a {got_dim}D batch for a {dim}D intermediary")
    if len(data) != HEADER.size + 8 * (n + n * dim + m):
        raise IntermediaryError(
            f"feed: a batch of {n} upserts and {m} deletions cannot be {len(data)} bytes"
        )
    if not math.isfinite(tick_time):
        raise IntermediaryError("feed: a batch's tick time must be finite")
    at = HEADER.size
    ids = np.frombuffer(data, dtype="<i8", count=n, offset=at)
    positions = np.frombuffer(data, dtype="<f8", count=n * dim, offset=at + 8 * n)
    delete = np.frombuffer(data, dtype="<i8", count=m, offset=at + 8 * (n + n * dim))
    batch = UpdateBatch(
        ids=ids.astype(np.int64),
        positions=positions.reshape(n, dim).astype(np.float64),
        delete=delete.astype(np.int64),
        tick=int(tick),
        tick_time=float(tick_time),
    )
    return batch, int(applied)


def _boxes(message: dict[str, Any], dim: int) -> list[Box]:
    boxes = message.get("boxes")
    if not isinstance(boxes, list):
        raise IntermediaryError(f"feed: {message.get('op')}: 'boxes' must be a list")
    out = []
    for spec in boxes:
        if not isinstance(spec, dict) or set(spec) != {"lo", "hi"}:
            raise IntermediaryError("feed: a box is {'lo': [...], 'hi': [...]}")
        box = Box(spec["lo"], spec["hi"])
        if box.dim != dim:
            raise IntermediaryError(f"feed: expected {dim}D boxes, got {box.dim}D")
        out.append(box)
    return out


def _entities(message: dict[str, Any]) -> frozenset[int]:
    entities = message.get("entities")
    if not isinstance(entities, list) or len(entities) > MAX_FOLLOWED:
        raise IntermediaryError(f"feed: follow: 'entities' must be a list of <= {MAX_FOLLOWED}")
    if not all(type(e) is int and -(2**63) <= e < 2**63 for e in entities):
        raise IntermediaryError("feed: follow: entities must be int64 ids")
    return frozenset(entities)


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
        feed.subscribe(_boxes(message, dim))
    elif op == "unsubscribe":
        feed.unsubscribe(_boxes(message, dim))
    elif op == "follow":
        feed.follow(_entities(message))
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

    def __init__(self, simulation: Simulation, tick_hz: float = 10.0) -> None:
        if not (isinstance(tick_hz, int | float) and math.isfinite(tick_hz) and tick_hz > 0):
            raise IntermediaryError(f"feed: tick_hz must be a number > 0, not {tick_hz!r}")
        self.simulation = simulation
        self.tick_hz = float(tick_hz)
        self.connections: list[FeedConnection] = []
        #: Bytes of batches sent (the upstream bandwidth), headers included.
        self.bytes_sent = 0
        self.port = 0
        self._server: Server | None = None
        self._ticker: asyncio.Task[None] | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen and start ticking; the URL intermediaries connect to."""
        try:
            self._server = await serve(
                self._endpoint,
                host,
                port,
                max_size=MAX_CONTROL_BYTES,
                compression=None,
                ping_interval=None,
            )
        except OSError as exc:
            raise IntermediaryError(
                f"feed: cannot listen on {host}:{port}: {exc.strerror}"
            ) from None
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        self._ticker = asyncio.get_running_loop().create_task(self._tick())
        return f"ws://{host}:{self.port}/"

    async def aclose(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
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


class RemoteFeed:
    """An intermediary's upstream in another process: the :class:`.process.Upstream`
    operations sent to a :class:`SimulationServer`, and the batches it sends kept for
    :meth:`take` (the intermediary server's ``source``). Use :meth:`connect`.

    Operations are checked here as the publisher will check them (so a mistake raises at
    the call, as with an in-process feed) and sent in order by one task."""

    def __init__(self, websocket: Any, dim: int, url: str = "") -> None:
        self.websocket = websocket
        self.dim = dim
        #: The publisher's URL (for messages).
        self.url = url
        self.bytes_received = 0
        #: Why the connection ended (None while open).
        self.closed_reason: str | None = None
        self.closed = asyncio.Event()
        self._boxes: list[Box] = []
        self._batches: list[tuple[UpdateBatch, int]] = []
        #: Operations sent, and how many of them the batches taken so far reflect
        #: (:func:`.process.requests_of`).
        self.requested = 0
        self.applied = 0
        self._outbox: asyncio.Queue[str] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def connect(cls, url: str, dim: int, *, open_timeout: float = 10.0) -> RemoteFeed:
        try:
            websocket = await websockets.connect(
                url,
                max_size=None,
                compression=None,
                ping_interval=None,
                open_timeout=open_timeout,
            )
        except (OSError, TimeoutError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
            raise IntermediaryError(f"feed: cannot connect to {url}: {exc}") from None
        feed = cls(websocket, dim, url)
        loop = asyncio.get_running_loop()
        feed._tasks = [loop.create_task(feed._read()), loop.create_task(feed._write())]
        return feed

    # -- the Upstream protocol ---------------------------------------------------------

    def subscribe(self, boxes: Sequence[Box]) -> None:
        self._check_open()
        boxes = list(boxes)
        for box in boxes:
            if not isinstance(box, Box) or box.dim != self.dim:
                raise IntermediaryError(f"feed: expected {self.dim}D boxes, got {box!r}")
        if len(self._boxes) + len(boxes) > MAX_FEED_BOXES:
            raise IntermediaryError(f"feed: more than {MAX_FEED_BOXES} boxes on one feed")
        self._boxes.extend(boxes)
        self._send({"op": "subscribe", "boxes": [_box(box) for box in boxes]})

    def unsubscribe(self, boxes: Sequence[Box]) -> None:
        self._check_open()
        kept = list(self._boxes)
        for box in boxes:
            try:
                kept.remove(box)
            except ValueError:
                raise IntermediaryError(f"feed: {box!r} is not subscribed") from None
        self._boxes = kept
        self._send({"op": "unsubscribe", "boxes": [_box(box) for box in boxes]})

    def follow(self, entities: frozenset[int]) -> None:
        if len(entities) > MAX_FOLLOWED:
            raise IntermediaryError(f"feed: more than {MAX_FOLLOWED} entities to follow")
        if not all(type(e) is int and -(2**63) <= e < 2**63 for e in entities):
            raise IntermediaryError("feed: follow expects int64 entity ids")
        self._send({"op": "follow", "entities": sorted(entities)})

    # -- batches -----------------------------------------------------------------------

    def take(self) -> list[UpdateBatch]:
        """The batches received since the last call, oldest first (what the intermediary
        applies next: :attr:`applied` counts the operations they reflect)."""
        batches, self._batches = self._batches, []
        for _, applied in batches:
            self.applied = max(self.applied, applied)
        return [batch for batch, _ in batches]

    async def aclose(self) -> None:
        if self.closed_reason is None:
            self.closed_reason = "closed by the intermediary"
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.websocket.close()
        self.closed.set()

    def _check_open(self) -> None:
        if self.closed_reason is not None:
            raise IntermediaryError(
                f"feed: the upstream connection is closed: {self.closed_reason}"
            )

    def _send(self, message: dict[str, Any]) -> None:
        self._check_open()
        self._outbox.put_nowait(json.dumps(message))
        self.requested += 1

    async def _write(self) -> None:
        try:
            while True:
                await self.websocket.send(await self._outbox.get())
        except websockets.ConnectionClosed as exc:
            self._ended(_why(exc))

    async def _read(self) -> None:
        try:
            async for message in self.websocket:
                if isinstance(message, str):
                    raise IntermediaryError("feed: the publisher sent text; batches are binary")
                self.bytes_received += len(message)
                self._batches.append(decode_batch(message, self.dim))
            self._ended(_why(None, self.websocket))
        except websockets.ConnectionClosed as exc:
            self._ended(_why(exc))
        except IntermediaryError as exc:
            self._ended(str(exc))
            await self.websocket.close(POLICY_CLOSE_CODE, close_reason(exc))

    def _ended(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
            log.warning("feed: upstream connection ended: %s", reason)
        self.closed.set()


def _box(box: Box) -> dict[str, list[float]]:
    return {"lo": list(box.lo), "hi": list(box.hi)}


def close_reason(exc: Exception) -> str:
    """``exc``'s message cut to what a close frame carries (123 bytes of UTF-8)."""
    return str(exc).encode()[:120].decode(errors="ignore")


def _why(exc: websockets.ConnectionClosed | None, websocket: Any = None) -> str:
    received = exc.rcvd if exc is not None else websocket.protocol.close_rcvd
    if received is None:
        return "the connection was lost"
    return f"closed by the publisher: {received.code} {received.reason}".strip()


async def remote_intermediary(
    url: str, world: Box, margin: float, *, open_timeout: float = 10.0
) -> tuple[Intermediary, RemoteFeed]:
    """An intermediary subscribing to the publisher at ``url`` (a :class:`RemoteFeed`; the
    caller's server takes its batches with :meth:`RemoteFeed.take`): upstream boxes grown by
    ``margin`` (claim 2), served when new state arrives ([89]'s "state updated" trigger) at
    most at each subscriber's rate, so a frame leaves right after its epoch."""
    feed = await RemoteFeed.connect(url, world.dim, open_timeout=open_timeout)
    node = Intermediary(
        world.dim,
        feed,
        world=world,
        policy=UpstreamPolicy.margin(margin),
        scheduler=Scheduler(per_epoch=True),
    )
    return node, feed
