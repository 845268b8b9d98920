"""The subscriber's side of a cluster of intermediaries: a client that follows redirects and
handovers by itself, so its frames per subscription form one stream (see :mod:`.member` for
the messages).

**The stream.** Frames carry the publisher's tick as their epoch, the same number at every
member. Per subscription key, :class:`ClusterClient` delivers frames whose epochs strictly
increase, across any number of handovers: during a handover it delivers the old member's
frames below the new member's ``from_epoch`` F, holds the new member's frames from F until
the old one says ``released`` (after its last frame), then delivers them. A frame whose epoch
is not above the last delivered one is dropped and counted in :attr:`ClusterClient.stale`
(it cannot happen when the members follow the protocol; the count is there so a test can say
so). A handover that fails (the new member is unreachable or refuses) leaves the
subscription where it was, still served, and the error in :attr:`ClusterClient.errors`.

**A member that dies.** The subscriptions it served are subscribed again through the entry
(which redirects to whoever the directory names now), retried with a growing pause for
:data:`RECOVER_S` seconds; the epochs published meanwhile are lost, the stream's epochs
still strictly increase, and each failed try is in :attr:`ClusterClient.errors`. A client
given several entries (a deployed tier's members' URLs) goes on to the next when its entry
is the member that died, so a tier has no member whose death strands its subscribers.

**Identity.** The client opens every connection (its entry, a redirect's owner, a
handover's new member, a dead member's heir) with the same credentials and TLS context, so
each member admits it as the same identity and holds it to the same grant: a redirect or a
handover never changes what the subscriber may see. A member that refuses it (401) is an
error naming that member, as for one that cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidings.errors import AccessRefused, IntermediaryError
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.client.subscriber import ReceivedFrame, Subscriber
from tidings.intermediary.serving.credentials import Credentials

#: The most redirects one subscribe follows.
MAX_HOPS = 4
#: How long a subscription whose member died is tried again, and the longest pause between.
RECOVER_S = 60.0
MAX_PAUSE_S = 1.0
#: The messages members push unasked (the rest are replies to requests).
PUSHED = frozenset({"handover", "released"})


class _Link(IntermediaryClient):
    """One connection of a :class:`ClusterClient`: frames and pushed messages go, in the
    order they arrived, into the owner's queue."""

    sink: asyncio.Queue[tuple[_Link, ReceivedFrame | dict[str, Any] | None]] | None = None
    url = ""

    def _on_text(self, message: dict[str, Any]) -> None:
        if self.sink is not None and message.get("op") in PUSHED:
            self.sink.put_nowait((self, message))
        else:
            super()._on_text(message)

    def _on_frame(self, frame: ReceivedFrame) -> None:
        if self.sink is not None:
            self.sink.put_nowait((self, frame))


@dataclass
class _Stream:
    """One subscription key: where it is served now, where it is moving to, what was
    delivered."""

    request: dict[str, Any]
    current: _Link | None = None
    floor: int = 0
    next: _Link | None = None
    start: int | None = None
    held: list[ReceivedFrame] = field(default_factory=list)
    last: int = -1
    moving: bool = False


class ClusterClient(Subscriber):
    """A subscriber of a cluster of intermediaries; use :meth:`connect` (``async with``
    closes it). ``client_id`` is the id responsibility by hash places it by (a random one
    by default)."""

    def __init__(
        self,
        entries: Sequence[str],
        client_id: str | None,
        max_buffered: int,
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if not entries:
            raise IntermediaryError("client: give at least one entry URL")
        #: Every member the client may enter the cluster at, :attr:`entry` the one in use.
        self.entries = tuple(entries)
        self.entry = self.entries[0]
        self.client_id = client_id or uuid.uuid4().hex
        self.max_buffered = max_buffered
        self.credentials = credentials
        self.tls = tls
        #: Frames dropped because their epoch was not above the last delivered one.
        self.stale = 0
        #: Handovers completed.
        self.handovers = 0
        #: Frames lost because the caller read too slowly (the buffer kept the latest).
        self.overflowed = 0
        #: What went wrong with a key's handover or connection, by key (the latest).
        self.errors: dict[str, str] = {}
        self._links: dict[str, _Link] = {}
        self._streams: dict[str, _Stream] = {}
        self._queue: asyncio.Queue[tuple[_Link, ReceivedFrame | dict[str, Any] | None]] = (
            asyncio.Queue()
        )
        self._out: deque[ReceivedFrame] = deque(maxlen=max_buffered)
        self._ready = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pump = asyncio.create_task(self._run())

    @classmethod
    async def connect(
        cls,
        entry: str | Sequence[str],
        *,
        client_id: str | None = None,
        max_buffered: int = 4096,
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> ClusterClient:
        """A client entering the cluster at ``entry`` (any member's URL), or at the first of
        several that answers (a tier's members: the others are where it goes on when its
        entry dies), proving ``credentials`` to each member (None: anonymous) and verifying
        ``wss://`` members with ``tls`` (default: the system's CAs)."""
        entries = [entry] if isinstance(entry, str) else list(entry)
        client = cls(entries, client_id, max_buffered, credentials, tls)
        try:
            await client._enter()
        except BaseException:
            await client.close()
            raise
        return client

    async def _enter(self) -> _Link:
        """A connection to an entry: the one in use, else the next that answers (it becomes
        the one in use); none answering is the last one's error."""
        start = self.entries.index(self.entry)
        failure: IntermediaryError | None = None
        for url in self.entries[start:] + self.entries[:start]:
            try:
                link = await self._link(url)
            except IntermediaryError as exc:
                failure = exc
                continue
            self.entry = url
            return link
        assert failure is not None
        raise failure

    # -- requests ----------------------------------------------------------------------

    async def _subscribe_region(self, key: str, request: dict[str, Any]) -> dict[str, Any]:
        """Subscribe ``key`` at the member responsible for it (following redirects); its
        ``subscribed`` reply (``intermediary`` names the member)."""
        if key in self._streams:
            raise IntermediaryError(f"client: {key!r} is subscribed already; unsubscribe first")
        request["client"] = self.client_id
        stream = _Stream(request)
        self._streams[key] = stream
        try:
            link, reply = await self._place(stream, (await self._enter()).url)
        except BaseException:
            self._streams.pop(key, None)
            raise
        self._switch(stream, link, int(reply["from_epoch"]))
        return reply

    async def unsubscribe(self, key: str) -> dict[str, Any]:
        """Unsubscribe ``key`` wherever it is served (both members during a handover)."""
        stream = self._streams.pop(key, None)
        if stream is None or stream.current is None:
            raise IntermediaryError(f"client: {key!r} is not subscribed")
        if stream.next is not None and stream.next is not stream.current:
            with contextlib.suppress(IntermediaryError):
                await stream.next.unsubscribe(key)
        return await stream.current.unsubscribe(key)

    def last_epoch(self, key: str) -> int:
        """The epoch of the last frame of ``key`` delivered (-1: none yet)."""
        return self._streams[key].last

    def latest(self, key: str) -> int:
        """How far ``key``'s stream has got: the newest epoch delivered or held during a
        handover (-1: none yet)."""
        stream = self._streams[key]
        return max([stream.last, *(frame.header.epoch for frame in stream.held)])

    def moving(self) -> bool:
        """Whether a handover of some key is under way."""
        return any(s.moving or s.next is not None for s in self._streams.values())

    def where(self, key: str) -> str:
        """The URL of the member serving ``key`` now."""
        current = self._streams[key].current
        return "" if current is None else current.url

    async def frames(self) -> AsyncIterator[ReceivedFrame]:
        """The delivered frames of every key, until :meth:`close`."""
        while True:
            while self._out:
                yield self._out.popleft()
            if self._pump.done():
                return
            self._ready.clear()
            await self._ready.wait()

    async def close(self) -> None:
        for task in [*self._tasks, self._pump]:
            task.cancel()
        for link in list(self._links.values()):
            with contextlib.suppress(Exception):
                await link.close()
        for task in [*self._tasks, self._pump]:
            with contextlib.suppress(BaseException):
                await task
        self._ready.set()

    # -- placing and moving ------------------------------------------------------------

    async def _link(self, url: str, owner: str = "") -> _Link:
        """The connection to ``url``, opened if needed; an unreachable member is an error
        naming it."""
        link = self._links.get(url)
        if link is not None and not link._closed.is_set():
            return link
        try:
            link = await _Link.connect(  # type: ignore[assignment]
                url, max_buffered=self.max_buffered, credentials=self.credentials, tls=self.tls
            )
        except AccessRefused:  # names the member's URL and its reason already
            raise
        except Exception as exc:  # refused, not a WebSocket, no hello: all name the member
            named = f"intermediary {owner!r} at {url}" if owner else url
            raise IntermediaryError(f"client: cannot reach {named}: {exc}") from None
        assert isinstance(link, _Link)
        link.sink = self._queue
        link.url = url
        self._links[url] = link
        self._spawn(self._watch(link))
        return link

    async def _place(
        self, stream: _Stream, url: str, owner: str = ""
    ) -> tuple[_Link, dict[str, Any]]:
        """Subscribe ``stream`` at ``url``, following redirects; frames of the member that
        says ``subscribed`` are held (as ``stream.next``) until the caller switches."""
        via: list[str] = []
        for _ in range(MAX_HOPS + 1):
            link = await self._link(url, owner)
            stream.next, stream.start, stream.held = link, None, []
            try:
                reply = await link.request({**stream.request, "via": via})
            except BaseException:
                stream.next, stream.held = None, []
                raise
            if reply.get("op") != "moved":
                return link, reply
            via, url, owner = list(reply["via"]), str(reply["to"]), str(reply["owner"])
        stream.next, stream.held = None, []
        raise IntermediaryError(
            f"client: more than {MAX_HOPS} redirects for {stream.request['key']!r} "
            f"(through {' -> '.join(via)})"
        )

    async def _move(self, key: str, to: str, owner: str) -> None:
        """Follow a handover of ``key`` to ``to`` (make before break)."""
        stream = self._streams.get(key)
        if stream is None or stream.current is None or stream.moving:
            return
        stream.moving = True
        old = stream.current
        try:
            link, reply = await self._place(stream, to, owner)
            # The old member may have delivered F already while the reply was on its way:
            # the new one takes over after the last epoch delivered.
            stream.start = max(int(reply["from_epoch"]), stream.last + 1)
            if link is old:  # the directory moved it back meanwhile
                stream.next, stream.start, stream.held = None, None, []
                return
            await old.request({"op": "release", "key": key, "before": stream.start})
        except Exception as exc:  # the old member keeps serving it
            stream.next, stream.start, stream.held = None, None, []
            self.errors[key] = str(exc)
        finally:
            stream.moving = False

    def _switch(self, stream: _Stream, link: _Link, start: int) -> None:
        """``link`` serves ``stream`` from epoch ``start`` on: deliver what it held."""
        held = [frame for frame in stream.held if frame.header.epoch >= start]
        self.errors.pop(str(stream.request["key"]), None)  # served again: past errors are past
        stream.current, stream.floor = link, start
        stream.next, stream.start, stream.held = None, None, []
        for frame in held:
            self._deliver(stream, frame)

    # -- the ordered queue of frames and pushed messages -------------------------------

    async def _watch(self, link: _Link) -> None:
        await link._closed.wait()
        self._queue.put_nowait((link, None))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self) -> None:
        while True:
            link, item = await self._queue.get()
            if item is None:
                self._closed(link)
            elif isinstance(item, ReceivedFrame):
                self._frame(link, item)
            else:
                self._pushed(link, item)

    def _frame(self, link: _Link, frame: ReceivedFrame) -> None:
        stream = self._streams.get(frame.key)
        if stream is None:
            return
        epoch = frame.header.epoch
        if link is stream.current:  # first: a redirect may lead back to it while moving
            if stream.start is not None and epoch >= stream.start:
                return  # the next member serves this epoch
            if epoch >= stream.floor:
                self._deliver(stream, frame)
        elif link is stream.next:
            stream.held.append(frame)

    def _deliver(self, stream: _Stream, frame: ReceivedFrame) -> None:
        if frame.header.epoch <= stream.last:
            self.stale += 1
            return
        stream.last = frame.header.epoch
        if len(self._out) == self._out.maxlen:
            self.overflowed += 1
        self._out.append(frame)
        self._ready.set()

    def _pushed(self, link: _Link, message: dict[str, Any]) -> None:
        key = message.get("key")
        stream = self._streams.get(key) if isinstance(key, str) else None
        if stream is None or link is not stream.current:
            return
        if message["op"] == "handover":
            self._spawn(self._move(str(key), str(message.get("to")), str(message.get("owner"))))
        elif stream.next is not None and stream.start is not None:  # released
            self._switch(stream, stream.next, stream.start)
            self.handovers += 1
            self._close_idle(link)

    def _closed(self, link: _Link) -> None:
        for key, stream in self._streams.items():
            if stream.current is not link:
                continue
            if stream.next is not None and stream.start is not None:
                self._switch(stream, stream.next, stream.start)
                self.handovers += 1
            elif not stream.moving:
                self.errors[key] = (
                    f"client: the connection to {link.url} closed "
                    f"({link.close_code} {link.close_reason})"
                )
                self._spawn(self._recover(key))
        self._links.pop(link.url, None)

    async def _recover(self, key: str) -> None:
        """Subscribe ``key`` again through the entry until it works or :data:`RECOVER_S`
        passes (see the module docstring)."""
        stream = self._streams.get(key)
        if stream is None:
            return
        stream.moving = True
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + RECOVER_S, 0.05
        try:
            while key in self._streams:
                try:
                    link, reply = await self._place(stream, (await self._enter()).url)
                except IntermediaryError as exc:
                    self.errors[key] = str(exc)
                    if loop.time() + pause > deadline:
                        return
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, MAX_PAUSE_S)
                    continue
                self._switch(stream, link, max(int(reply["from_epoch"]), stream.last + 1))
                self.errors.pop(key, None)
                return
        finally:
            stream.moving = False

    def _close_idle(self, link: _Link) -> None:
        """Close a connection no subscription uses any more (the entry's stays open)."""
        if link.url == self.entry:
            return
        if any(link in (s.current, s.next) for s in self._streams.values()):
            return
        self._links.pop(link.url, None)
        self._spawn(link.close())
