"""Stopping an asyncio task that runs in the background of a part.

A server's loop, ticker or reader runs as a task until its owner closes; closing cancels it
and waits for it to end, so that nothing of it runs past the close. Its cancellation is the
expected end, not an error, and is not passed on. One helper, so that every part stops its
tasks the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def stop_task(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended; its :class:`asyncio.CancelledError` is
    swallowed (any other error it ends with is raised)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
