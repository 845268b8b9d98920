"""The intermediary's side of the spatial feed (:mod:`~tidings.intermediary.feed.wire`):
:class:`RemoteFeed`, its upstream in another process, and :func:`remote_intermediary`, an
intermediary built on one.

The :class:`~tidings.intermediary.node.intermediary.Upstream` operations are checked here as
the publisher will check them (so a mistake raises at the call, as with an in-process feed)
and sent in order by one task; the batches the publisher sends are kept for
:meth:`RemoteFeed.take`, counting the operations they reflect
(:func:`~tidings.intermediary.node.intermediary.requests_of`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import websockets

from tidings.errors import IntermediaryError
from tidings.intermediary.feed.wire import (
    MAX_FEED_BOXES,
    MAX_FOLLOWED,
    POLICY_CLOSE_CODE,
    box_spec,
    close_reason,
    decode_batch,
)
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.node.intermediary import Intermediary, Upstream
from tidings.intermediary.node.scheduling import Scheduler
from tidings.intermediary.regions.coverage import UpstreamPolicy
from tidings.intermediary.regions.geometry import Box
from tidings.tasks import stop_task

log = logging.getLogger(__name__)

#: No TLS options: a ``ws://`` publisher, or a ``wss://`` one verified by the system's CAs.
NO_TLS: Mapping[str, Any] = MappingProxyType({})


class RemoteFeed:
    """An intermediary's upstream in another process: the :class:`.node.intermediary.Upstream`
    operations sent to a publisher (:class:`.publisher.server.SimulationServer`, or any
    speaking :mod:`~tidings.intermediary.feed.wire`), and the batches it sends kept for
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
        #: (:func:`.node.intermediary.requests_of`).
        self.requested = 0
        self.applied = 0
        self._outbox: asyncio.Queue[str] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def connect(
        cls, url: str, dim: int, *, open_timeout: float = 10.0, tls: Mapping[str, Any] = NO_TLS
    ) -> RemoteFeed:
        """Connected to the publisher at ``url``; ``tls``: the TLS options of a ``wss://``
        one (:func:`tidings.config.intermediary.tls_connect_options`; without them a ``wss://``
        publisher is verified against the system's CAs). A publisher that cannot be reached,
        or whose certificate does not verify, is an error naming it."""
        try:
            websocket = await websockets.connect(
                url,
                max_size=None,
                compression=None,
                ping_interval=None,
                open_timeout=open_timeout,
                **tls,
            )
        except (OSError, TimeoutError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
            # A TLS alert read in place of the HTTP answer is the cause of "no valid HTTP
            # response" (a publisher that wants a client certificate): say it.
            cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
            raise IntermediaryError(f"feed: cannot connect to {url}: {exc}{cause}") from None
        feed = cls(websocket, dim, url)
        loop = asyncio.get_running_loop()
        feed._tasks = [loop.create_task(feed._read()), loop.create_task(feed._write())]
        return feed

    # -- the Upstream protocol ---------------------------------------------------------

    def subscribe(self, boxes: Sequence[Box]) -> None:
        self._check_open()
        boxes = checked_boxes(boxes, self.dim)
        if len(self._boxes) + len(boxes) > MAX_FEED_BOXES:
            raise IntermediaryError(f"feed: more than {MAX_FEED_BOXES} boxes on one feed")
        self._boxes.extend(boxes)
        self._send({"op": "subscribe", "boxes": [box_spec(box) for box in boxes]})

    def unsubscribe(self, boxes: Sequence[Box]) -> None:
        self._check_open()
        self._boxes = without(self._boxes, boxes)
        self._send({"op": "unsubscribe", "boxes": [box_spec(box) for box in boxes]})

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
            await stop_task(task)
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


def _why(exc: websockets.ConnectionClosed | None, websocket: Any = None) -> str:
    received = exc.rcvd if exc is not None else websocket.protocol.close_rcvd
    if received is None:
        return "the connection was lost"
    return f"closed by the publisher: {received.code} {received.reason}".strip()


def checked_boxes(boxes: Sequence[Box], dim: int) -> list[Box]:
    """``boxes`` as a list, each a :class:`Box` of ``dim`` dimensions, or the error a feed's
    caller gets before anything is sent."""
    boxes = list(boxes)
    for box in boxes:
        if not isinstance(box, Box) or box.dim != dim:
            raise IntermediaryError(f"feed: expected {dim}D boxes, got {box!r}")
    return boxes


def without(subscribed: Sequence[Box], boxes: Sequence[Box]) -> list[Box]:
    """The ``subscribed`` boxes less one of each of ``boxes`` (a box subscribed twice stays
    once); a box that is not subscribed is an error, and nothing is removed."""
    kept = list(subscribed)
    for box in boxes:
        try:
            kept.remove(box)
        except ValueError:
            raise IntermediaryError(f"feed: {box!r} is not subscribed") from None
    return kept


async def remote_intermediary(
    url: str,
    world: Box,
    margin: float,
    *,
    open_timeout: float = 10.0,
    tls: Mapping[str, Any] = NO_TLS,
) -> tuple[Intermediary, RemoteFeed]:
    """An intermediary subscribing to the publisher at ``url`` (a :class:`RemoteFeed`; the
    caller's server takes its batches with :meth:`RemoteFeed.take`): upstream boxes grown by
    ``margin`` (claim 2), served when new state arrives ([89]'s "state updated" trigger) at
    most at each subscriber's rate, so a frame leaves right after its epoch."""
    feed = await RemoteFeed.connect(url, world.dim, open_timeout=open_timeout, tls=tls)
    return margin_intermediary(feed, world, margin), feed


def margin_intermediary(feed: Upstream, world: Box, margin: float) -> Intermediary:
    """An intermediary of ``world`` fed by ``feed`` with the policy above: upstream boxes
    grown by ``margin``, a frame served right after each epoch; the one policy of an
    intermediary fed by a remote publisher, however it reaches it."""
    return Intermediary(
        world.dim,
        feed,
        world=world,
        policy=UpstreamPolicy.margin(margin),
        scheduler=Scheduler(per_epoch=True),
    )
