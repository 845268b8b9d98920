"""An asyncio event loop in a thread of its own, for targets whose clients are asyncio-only.

The relay calls a target synchronously, from Spark tasks running in plain threads, while
nats-py and tidings' event-server client are asyncio libraries. Such a target owns one
:class:`LoopThread`: a private loop in a daemon thread, started on first use, that every
calling thread hands its coroutines to and waits on with a bound. One loop per target (not
one per call) is what lets a target keep one connection and pipeline many calls over it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class LoopThread:
    """A private asyncio loop in a daemon thread, so synchronous callers can run coroutines."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        """Whether the loop runs (it starts on the first :meth:`run`)."""
        return self._loop is not None

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float) -> _T:
        """Run ``coro`` on the loop and wait up to ``timeout`` seconds for its result.

        If the wait ends without one (``TimeoutError``, or the caller is interrupted), the
        coroutine is cancelled: nothing of a call goes on after its caller gave up on it.
        """
        future = asyncio.run_coroutine_threadsafe(coro, self._running())
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        """Stop the loop and its thread; a later :meth:`run` starts new ones."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop
