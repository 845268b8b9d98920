"""No ``asyncio.wait_for`` in tidings: on Python 3.11 it loses a cancellation that lands in
the same turn as the awaited result (fixed in 3.12), and a task told to stop then runs on.

It happened: a Syncer client closed while its peer went away kept reconnecting forever, in
one run of two of the Monitor test. ``async with asyncio.timeout(...)`` keeps the
cancellation; this check keeps ``wait_for`` from coming back.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import tidings
from tests.support.helpers import parse_python
from tests.support.waiting import run

PACKAGE = Path(tidings.__file__).resolve().parent


def _wait_for_calls(source: str) -> list[int]:
    """Lines of ``asyncio.wait_for(...)`` calls and of ``wait_for`` imported from asyncio."""
    lines = []
    for node in ast.walk(parse_python(source)):
        if isinstance(node, ast.Attribute) and node.attr == "wait_for":
            if isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "asyncio":
            lines += [node.lineno for alias in node.names if alias.name == "wait_for"]
    return lines


def test_no_module_uses_asyncio_wait_for() -> None:
    found = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := _wait_for_calls(path.read_text()))
    }
    assert found == {}, f"use `async with asyncio.timeout(...)` instead: {found}"


def test_the_check_sees_both_spellings() -> None:
    source = "import asyncio\nfrom asyncio import wait_for\nawait asyncio.wait_for(x, 1)\n"
    assert _wait_for_calls(source) == [2, 3]


def test_a_timeout_block_keeps_a_cancellation_that_wait_for_loses() -> None:
    """The reason, shown: the awaited result and the cancellation arrive in one turn."""

    async def outcome(use_wait_for: bool) -> str:
        done = asyncio.get_running_loop().create_future()

        async def waiter() -> None:
            if use_wait_for:
                await asyncio.wait_for(done, 5)
            else:
                async with asyncio.timeout(5):
                    await done

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # the waiter is waiting
        done.set_result(None)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "ran on"

    assert run(outcome(use_wait_for=False)) == "cancelled"
    assert run(outcome(use_wait_for=True)) == "ran on"  # Python 3.11's wait_for
