"""The push sessions running on one stream, tracked in one place.

A session is known by its channel and, for a reliable consumer, by the consumer too: a
channel has at most one session (``readyToReceive`` again, or the socket closing, stops it),
and a consumer has at most one (a newer session of the same consumer, on any channel,
replaces the older one). A session leaves both when its task ends.
"""

from __future__ import annotations

import asyncio

from tidings.streams.protocol.channel import Channel
from tidings.streams.service.push import PushSession, stop_session

#: A reliable consumer: its user and component.
ConsumerKey = tuple[str, str]
_Running = tuple[PushSession, asyncio.Task[None]]


class PushSessions:
    """The running push sessions of one stream."""

    def __init__(self, stream: str) -> None:
        self._stream = stream
        self._by_channel: dict[Channel, _Running] = {}
        self._by_consumer: dict[ConsumerKey, _Running] = {}

    @property
    def reliable(self) -> int:
        """How many reliable consumers have a session running."""
        return len(self._by_consumer)

    def start(self, session: PushSession, channel: Channel, consumer: ConsumerKey | None) -> None:
        """Run ``session`` on ``channel`` (for ``consumer`` if it is reliable); the channel's
        and the consumer's earlier sessions must have been stopped first."""
        task = asyncio.get_running_loop().create_task(session.run(), name=f"push {self._stream}")
        running = (session, task)
        self._by_channel[channel] = running
        if consumer is not None:
            self._by_consumer[consumer] = running
        task.add_done_callback(lambda _: self._forget(channel, consumer, running))

    async def stop_channel(self, channel: Channel) -> None:
        """Stop the channel's session, if it has one (see :func:`.push.stop_session`)."""
        running = self._by_channel.pop(channel, None)
        if running is not None:
            await stop_session(*running)

    async def stop_consumer(self, consumer: ConsumerKey) -> None:
        """Stop the consumer's session, if it has one."""
        running = self._by_consumer.pop(consumer, None)
        if running is not None:
            await stop_session(*running)

    async def aclose(self) -> None:
        """Stop every session."""
        for running in list(self._by_channel.values()):
            await stop_session(*running)
        self._by_channel.clear()
        self._by_consumer.clear()

    def _forget(self, channel: Channel, consumer: ConsumerKey | None, running: _Running) -> None:
        if self._by_channel.get(channel) is running:
            del self._by_channel[channel]
        if consumer is not None and self._by_consumer.get(consumer) is running:
            del self._by_consumer[consumer]
