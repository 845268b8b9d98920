"""A member of the cluster in another process as the source of its cells' state (claims 9,
11): this member subscribes to it over the subscriber wire, like any subscriber, for the
pieces of its upstream boxes that lie in that member's cells, and keeps the last epochs of
each piece's frames. The remote member is then responsible for those pieces (its own
upstream covers them), and a view spanning both areas is composed per epoch from this
member's state and the remote frames of the same epoch (:class:`.areas.Composer`).

It connects as a member of the tier (the credentials its supervisor gave it, granted
everything: the piece belongs to a view this member checked against its own subscriber's
grant) and verifies a ``wss://`` member's certificate with the tier's TLS context.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import Counter
from collections.abc import Sequence

import numpy as np

from tidings.errors import IntermediaryError
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.client.subscriber import Subscriber
from tidings.intermediary.node.generation import MAX_ENTITIES_CAP, FrameKind
from tidings.intermediary.node.intermediary import MAX_RATE_HZ
from tidings.intermediary.node.publisher_store import DEFAULT_MAX_PER_SUBSCRIBER
from tidings.intermediary.regions.geometry import Box
from tidings.intermediary.serving.credentials import Credentials

log = logging.getLogger(__name__)

#: How many epochs of each piece are kept (a view waits at most this long for a remote part).
HISTORY = 32

#: A piece is taken whole and exact: never truncated, float64.
WHOLE_PIECE = {"max_entities": MAX_ENTITIES_CAP}

Part = tuple[np.ndarray, np.ndarray]


class RemotePart:
    """The member called ``name`` at ``url``, as an upstream of this member (it implements
    the ``Upstream`` protocol) and as the source of :meth:`part`. Must be created on the
    running event loop; :meth:`aclose` ends its connection."""

    def __init__(
        self,
        name: str,
        url: str,
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.credentials = credentials
        self.tls = tls
        #: Why the remote member could not be used (empty while all is well).
        self.error = ""
        self._count: Counter[Box] = Counter()
        self._keys: dict[Box, str] = {}
        self._frames: dict[str, dict[int, Part]] = {}
        self._latest: dict[str, Part] = {}
        #: From which epoch a piece's frames are complete (the remote member's upstream
        #: covers it from its ``from_epoch`` on; earlier frames may miss entities).
        self._start: dict[str, int] = {}
        self._serial = 0
        #: Subscribe (key, box) or unsubscribe (key, None), in order.
        self._ops: asyncio.Queue[tuple[str, Box | None]] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def subscribe(self, boxes: Sequence[Box]) -> None:
        for box in boxes:
            if self._count[box] == 0:
                self._serial += 1
                key = f"p{self._serial}"
                self._keys[box] = key
                self._frames[key] = {}
                self._ops.put_nowait((key, box))
            self._count[box] += 1

    def follow(self, entities: frozenset[int]) -> None:
        """Refused: a member follows entities through its own feed, never a peer's area."""
        raise IntermediaryError(f"upstream: member {self.name!r} only holds pieces of boxes")

    def unsubscribe(self, boxes: Sequence[Box]) -> None:
        for box in boxes:
            if self._count[box] == 0:
                raise IntermediaryError(f"upstream: {box!r} is not subscribed at {self.name!r}")
            self._count[box] -= 1
            if self._count[box] == 0:
                del self._count[box]
                key = self._keys.pop(box)
                self._frames.pop(key, None)
                self._latest.pop(key, None)
                self._start.pop(key, None)
                self._ops.put_nowait((key, None))

    def part(self, epoch: int) -> Part | None:
        """The entities of every piece at ``epoch``, or None while one piece's complete
        frame of that epoch has not arrived."""
        ids: list[np.ndarray] = []
        positions: list[np.ndarray] = []
        for key in self._keys.values():
            got = self._frames[key].get(epoch)
            if got is None or epoch < self._start.get(key, epoch + 1):
                return None
            ids.append(got[0])
            positions.append(got[1])
        if not ids:
            return np.zeros(0, np.int64), np.zeros((0, 0))
        return np.concatenate(ids), np.concatenate(positions)

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task

    async def _run(self) -> None:
        #: Connections to the remote member with the keys each holds: a member takes at most
        #: DEFAULT_MAX_PER_SUBSCRIBER subscriptions per connection, like any subscriber.
        links: list[tuple[Subscriber, set[str]]] = []
        readers: list[asyncio.Task[None]] = []
        try:
            while True:
                key, box = await self._ops.get()
                try:
                    if box is not None:
                        client = await self._link(links, readers)
                        keys = next(k for c, k in links if c is client)
                        keys.add(key)
                        region = {"box": {"lo": list(box.lo), "hi": list(box.hi)}}
                        try:
                            reply = await client.subscribe(
                                key, region, rate_hz=MAX_RATE_HZ, capabilities=WHOLE_PIECE
                            )
                        except IntermediaryError:
                            keys.discard(key)
                            raise
                        if key in self._frames:
                            self._start[key] = int(reply["from_epoch"])
                    else:
                        for client, keys in links:
                            if key in keys:
                                keys.discard(key)
                                await client.unsubscribe(key)
                except IntermediaryError as exc:
                    self.error = f"peer {self.name!r}: {exc}"
                    log.warning("%s", self.error)
        finally:
            for reader in readers:
                reader.cancel()
            for client, _ in links:
                with contextlib.suppress(BaseException):
                    await client.close()

    async def _link(
        self, links: list[tuple[Subscriber, set[str]]], readers: list[asyncio.Task[None]]
    ) -> Subscriber:
        """A connection with room for one more piece, opened if none has (to the member
        itself: a piece is never redirected)."""
        for client, keys in links:
            if len(keys) < DEFAULT_MAX_PER_SUBSCRIBER:
                return client
        try:
            client = await IntermediaryClient.connect(
                self.url, credentials=self.credentials, tls=self.tls
            )
        except Exception as exc:  # refused, not a member: named, and views wait for it
            raise IntermediaryError(
                f"cannot reach intermediary {self.name!r} at {self.url}: {exc}"
            ) from None
        links.append((client, set()))
        readers.append(asyncio.create_task(self._read(client)))
        return client

    async def _read(self, client: Subscriber) -> None:
        async for frame in client.frames():
            frames = self._frames.get(frame.key)
            if frame.header.kind is FrameKind.UNCHANGED:
                content = self._latest.get(frame.key)
            else:
                content = (frame.ids, frame.world_positions())
            if frames is None or content is None:
                continue
            self._latest[frame.key] = content
            frames[frame.header.epoch] = content
            while len(frames) > HISTORY:
                del frames[next(iter(frames))]
