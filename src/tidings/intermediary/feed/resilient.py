"""A spatial upstream that outlives its connection: :class:`ResilientFeed`, the
:class:`~tidings.intermediary.node.intermediary.Upstream` of a served intermediary, over one
:class:`~.remote.RemoteFeed` at a time to any of the publisher's URLs.

When the connection ends the feed is *stale* (:attr:`ResilientFeed.stale` says why): the
intermediary keeps serving the state it holds, and the operations asked meanwhile are kept.
The feed tries the URLs in turn, waiting by a :class:`~tidings.tasks.Backoff` after each round
that reached none; on a new connection it subscribes the boxes and follows the entities the
intermediary wants now. A publisher's batches are relative to what it sent on that
connection, so the first batch of a new one is the whole state inside the boxes: handed over
with every entity the intermediary held and that batch lacks deleted (``held``, asked then),
it leaves the state exactly the publisher's, nothing kept from before the loss. Then the feed
is fresh again.

Operations are counted as :func:`~tidings.intermediary.node.intermediary.requests_of` wants:
those asked while stale are reflected only once the new connection's first batch came, so
no view is served from state the publisher has not filled yet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tidings.errors import IntermediaryError
from tidings.intermediary.feed.remote import NO_TLS, RemoteFeed, checked_boxes, without
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.regions.geometry import Box
from tidings.intermediary.staleness import Staleness
from tidings.tasks import Backoff, stop_task

log = logging.getLogger(__name__)


class ResilientFeed:
    """An intermediary's spatial upstream at ``urls`` (tried in turn), reconnecting when lost;
    use :meth:`connect`, then :meth:`aclose`. ``held`` gives the ids the intermediary's state
    holds (for the first batch after a reconnection)."""

    def __init__(
        self,
        urls: Sequence[str],
        dim: int,
        held: Callable[[], np.ndarray],
        *,
        backoff: Backoff | None = None,
        open_timeout: float = 10.0,
        tls: Mapping[str, Any] = NO_TLS,
    ) -> None:
        if not urls:
            raise IntermediaryError("feed: expected at least one publisher URL")
        self.urls = tuple(urls)
        self.dim = dim
        self.held = held
        self.backoff = backoff or Backoff()
        self.open_timeout = open_timeout
        self.tls = tls
        #: Why the feed is not fresh, and each change of it (see :attr:`stale`).
        self.staleness = Staleness("not connected")
        #: How many times it reconnected.
        self.reconnects = 0
        self.requested = 0
        self.applied = 0
        self._feed: RemoteFeed | None = None
        self._boxes: list[Box] = []
        self._followed: frozenset[int] = frozenset()
        #: Own operations asked before the current connection, and the operations sent on
        #: it to catch up (its first batch reflects them all).
        self._base = 0
        self._resent = 0
        self._replace_next = False
        self._task: asyncio.Task[None] | None = None

    @property
    def stale(self) -> str | None:
        """Why the feed is not fresh (None while connected and in sync)."""
        return self.staleness.why

    @property
    def url(self) -> str:
        return self._feed.url if self._feed is not None else self.urls[0]

    @classmethod
    async def connect(
        cls,
        urls: Sequence[str],
        dim: int,
        held: Callable[[], np.ndarray],
        *,
        open_timeout: float = 10.0,
        tls: Mapping[str, Any] = NO_TLS,
    ) -> ResilientFeed:
        """Connected to the first URL that answers (``tls``: as
        :meth:`.remote.RemoteFeed.connect` takes it); none answering is an error here."""
        feed = cls(urls, dim, held, open_timeout=open_timeout, tls=tls)
        feed._feed = await feed._connect_any()
        feed.staleness.fresh()
        feed._task = asyncio.get_running_loop().create_task(feed._run())
        return feed

    # -- the Upstream protocol ---------------------------------------------------------

    def subscribe(self, boxes: Sequence[Box]) -> None:
        boxes = checked_boxes(boxes, self.dim)
        self._send(lambda feed: feed.subscribe(boxes))
        self._boxes.extend(boxes)

    def unsubscribe(self, boxes: Sequence[Box]) -> None:
        kept = without(self._boxes, boxes)
        self._send(lambda feed: feed.unsubscribe(boxes))
        self._boxes = kept

    def follow(self, entities: frozenset[int]) -> None:
        self._send(lambda feed: feed.follow(entities))
        self._followed = frozenset(entities)

    def take(self) -> list[UpdateBatch]:
        """The batches received since the last call, oldest first; the first of a new
        connection deletes what the intermediary held outside it."""
        feed = self._feed
        if feed is None:
            return []
        batches = feed.take()
        if batches and self._replace_next:
            first = batches[0]
            current = np.asarray(first.ids, dtype=np.int64)
            gone = np.setdiff1d(self.held(), current)
            delete = np.union1d(np.asarray(first.delete, dtype=np.int64), gone)
            batches[0] = UpdateBatch(
                first.ids, first.positions, first.columns, np.setdiff1d(delete, current),
                first.tick, first.tick_time,
            )  # fmt: skip
            self._replace_next = False
            self.staleness.fresh()
            log.warning("feed: resynchronised from %s", feed.url)
        if feed.applied >= self._resent and not self._replace_next:
            self.applied = self._base + feed.applied - self._resent
        return batches

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
        if self._feed is not None:
            await self._feed.aclose()
        self.staleness.lost("closed")

    # -- the connection ----------------------------------------------------------------

    def _send(self, operation: Callable[[RemoteFeed], None]) -> None:
        """Check and send ``operation`` on the connection if there is one (else it is
        caught up on the next), then count it."""
        feed = self._feed
        if feed is not None and feed.closed_reason is None:
            operation(feed)
        self.requested += 1

    async def _connect_any(self) -> RemoteFeed:
        errors = []
        for url in self.urls:
            try:
                return await RemoteFeed.connect(
                    url, self.dim, open_timeout=self.open_timeout, tls=self.tls
                )
            except IntermediaryError as exc:
                errors.append(str(exc))
        raise IntermediaryError("; ".join(errors))

    async def _run(self) -> None:
        """Wait for the connection's end; then reconnect, forever."""
        while True:
            assert self._feed is not None
            await self._feed.closed.wait()
            self.staleness.lost(self._feed.closed_reason or "the connection was lost")
            log.warning("feed: %s lost: %s; serving stale state", self._feed.url, self.stale)
            await self._feed.aclose()
            while True:
                try:
                    feed = await self._connect_any()
                    break
                except IntermediaryError as exc:
                    delay = self.backoff.next_delay()
                    log.info("feed: %s; next try in %.2f s", exc, delay)
                    await asyncio.sleep(delay)
            self.backoff.reset()
            self._base, self._resent = self.requested, 0
            if self._boxes:
                feed.subscribe(self._boxes)
                self._resent += 1
            if self._followed:
                feed.follow(self._followed)
                self._resent += 1
            self._feed = feed
            self._replace_next = True
            self.reconnects += 1
