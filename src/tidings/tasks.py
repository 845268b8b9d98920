"""Stopping an asyncio task that runs in the background of a part.

A server's loop, ticker or reader runs as a task until its owner closes; closing cancels it
and waits for it to end, so that nothing of it runs past the close. Its cancellation is the
expected end, not an error, and is not passed on. One helper, so that every part stops its
tasks the same way; one :class:`Backoff`, so that every part that reconnects waits alike;
and one :func:`run_every` for the blocking upkeep a part runs now and then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any


async def stop_task(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended; its :class:`asyncio.CancelledError` is
    swallowed (any other error it ends with is raised)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def run_every(
    every: float,
    executor: Executor,
    work: Callable[[], object],
    failed: str,
    log: logging.Logger,
) -> None:
    """Run the blocking ``work`` in ``executor`` every ``every`` seconds until cancelled. A
    run that fails is logged (``failed`` says what failed) and the next one tries again: an
    upkeep in the background must not end for one bad run."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every)
        try:
            await loop.run_in_executor(executor, work)
        except Exception:
            log.exception("%s; retrying at the next run", failed)


class Backoff:
    """Delays between attempts to reach an upstream again: ``first`` seconds, doubled after
    each failed attempt up to ``cap``, each shortened by a random share of up to ``jitter``
    (so many intermediaries that lost one server do not knock on the next all at once).
    :meth:`reset` after a success, so the next outage starts quick again."""

    def __init__(self, first: float = 0.1, cap: float = 5.0, jitter: float = 0.2) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"backoff: expected 0 < first <= cap, got {first} and {cap}")
        if not 0 <= jitter < 1:
            raise ValueError(f"backoff: jitter must be in [0, 1), got {jitter}")
        self.first, self.cap, self.jitter = first, cap, jitter
        self._next = first

    def reset(self) -> None:
        self._next = self.first

    def next_delay(self) -> float:
        """The delay before the next attempt (and double it for the one after)."""
        delay = self._next * (1 - random.random() * self.jitter)
        self._next = min(self._next * 2, self.cap)
        return delay
