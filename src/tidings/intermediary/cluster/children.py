"""Child processes of the intermediary tier (intermediaries of a measurement or of a process
cluster, measuring subscribers): each is ``python -m MODULE`` given a JSON plan on its stdin's
first line, and answers one line starting with ``ready`` once it serves (or ``error`` and
why). One way to start them and to read that answer, so every parent reports a child that
did not start the same way: naming it and quoting what it said.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any

from tidings.errors import IntermediaryError

#: Seconds a child that was asked to stop (SIGTERM) may take before it is killed.
STOP_TIMEOUT_S = 10.0


async def spawn(
    module: str, plan: dict[str, Any], *, limit: int = 1 << 16
) -> asyncio.subprocess.Process:
    """Start ``python -m module`` with ``plan`` on its stdin (which stays open: a child may
    read commands from it, or end when it closes). ``limit``: the longest line the parent
    may read from the child's stdout."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=limit,
    )
    assert process.stdin is not None
    process.stdin.write(json.dumps(plan).encode() + b"\n")
    await process.stdin.drain()
    return process


async def ready(process: asyncio.subprocess.Process, what: str, timeout: float) -> list[str]:
    """The words after ``ready`` on the child's first line; if it says anything else, or
    nothing within ``timeout`` seconds, it is ended and the error names ``what`` and quotes
    what it said."""
    assert process.stdout is not None
    try:
        async with asyncio.timeout(timeout):
            line = await process.stdout.readline()
    except TimeoutError:
        line = b""
    except BaseException:  # cancelled while it starts: it must not outlive the parent
        await asyncio.shield(end(process, kill=True))
        raise
    words = line.decode(errors="replace").split()
    if not words or words[0] != "ready":
        await end(process)
        raise IntermediaryError(f"{what} did not start (it said {line!r:.200})")
    return words[1:]


async def end(
    process: asyncio.subprocess.Process, timeout: float = STOP_TIMEOUT_S, *, kill: bool = False
) -> None:
    """SIGTERM (SIGKILL with ``kill``), then SIGKILL if the child does not exit within
    ``timeout`` seconds. Its pipes are closed and drained too: a child's transport left open
    is closed by the garbage collector after the event loop, which then fails."""
    with contextlib.suppress(ProcessLookupError):
        process.kill() if kill else process.terminate()
    try:
        async with asyncio.timeout(timeout):
            await process.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.communicate()
