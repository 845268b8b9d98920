"""A subscriber that watches an intermediary's SQL view for the whole of a test, through the
intermediary's crashes: on its own event loop in a thread, it subscribes, keeps every view
it is sent, and when the connection is lost connects and subscribes again, as a subscriber
application would."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import websockets

from tidings.errors import IntermediaryError
from tidings.intermediary.client.client import IntermediaryClient

#: The pause between two tries to reach an intermediary that is down.
RECONNECT_PAUSE = 0.2


class ViewWatcher:
    """Subscribed to ``sql`` at ``url`` (``ws://host:port/``) from :meth:`start` to
    :meth:`stop`."""

    def __init__(self, url: str, sql: str, *, rate_hz: float = 20.0) -> None:
        self.url = url
        self.sql = sql
        self.rate_hz = rate_hz
        #: Every view with rows it was sent: (time.monotonic() on arrival, the connection's
        #: number from 1, the rows).
        self.views: list[tuple[float, int, list[list[Any]]]] = []
        #: The view errors it was sent.
        self.errors: list[str] = []
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._watch(), self._loop)

    def stop(self) -> None:
        """Close the connection and end the thread."""
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(_cancel_tasks(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    def latest(self) -> list[list[Any]] | None:
        return self.views[-1][2] if self.views else None

    def views_since(self, moment: float) -> int:
        """How many views arrived after ``moment`` (a time.monotonic())."""
        return sum(1 for arrived, _, _ in self.views if arrived > moment)

    async def _watch(self) -> None:
        while True:
            try:
                client = await IntermediaryClient.connect(self.url)
            except (OSError, TimeoutError, IntermediaryError, websockets.WebSocketException):
                await asyncio.sleep(RECONNECT_PAUSE)
                continue
            self.connections += 1
            try:
                await self._follow(client, self.connections)
            except IntermediaryError:
                pass  # the connection was lost: connect again
            finally:
                with contextlib.suppress(Exception):
                    await client.close()

    async def _follow(self, client: IntermediaryClient, connection: int) -> None:
        await client.subscribe_sql("watched", self.sql, rate_hz=self.rate_hz)
        while True:
            message = await client.message()
            if message.get("op") != "view":
                continue
            if "error" in message:
                self.errors.append(str(message["error"]))
            elif "rows" in message:
                self.views.append((time.monotonic(), connection, message["rows"]))


async def _cancel_tasks() -> None:
    """Cancel the loop's other tasks (the watch, its client's reader) and wait for them."""
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
