"""Waiting in tests, always bounded: a coroutine run with a deadline, a condition polled from a
thread or on the event loop (a port is waited for by ``processes.wait_for_port``, shared with
the benchmarks). A wait that runs out fails the test with what it waited for, instead of
hanging the run until pytest-timeout kills it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run ``coro`` on a fresh event loop, failing the test if it takes over ``timeout`` s."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def wait_until(
    predicate: Callable[[], bool],
    timeout: float = 90.0,
    *,
    interval: float = 0.1,
    explain: Callable[[], str] | None = None,
) -> None:
    """Poll ``predicate`` every ``interval`` s until true; fail the test if it is not within
    ``timeout`` s, with ``explain()`` (a log tail, say) in the message."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            detail = f": {explain()}" if explain is not None else ""
            raise AssertionError(f"condition not reached in {timeout} s{detail}")
        time.sleep(interval)


async def until(
    predicate: Callable[[], bool], timeout: float = 15.0, *, interval: float = 0.01
) -> None:
    """:func:`wait_until` on the running loop: poll without blocking it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"condition not reached in {timeout} s"
        await asyncio.sleep(interval)
