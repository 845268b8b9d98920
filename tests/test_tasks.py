"""``stop_task``: a background task is cancelled and waited for; its cancellation is the
expected end and is swallowed, any other error it ends with is not."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.waiting import run
from tidings.tasks import stop_task


def test_a_running_task_is_cancelled_and_has_ended_when_stop_returns() -> None:
    async def scenario() -> tuple[bool, bool]:
        task = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        await asyncio.sleep(0)  # the task runs, waiting in its sleep
        await stop_task(task)
        return task.done(), task.cancelled()

    assert run(scenario()) == (True, True)


def test_a_finished_task_stops_quietly_and_keeps_its_result() -> None:
    async def scenario() -> int:
        task = asyncio.get_running_loop().create_task(asyncio.sleep(0, result=7))
        await task
        await stop_task(task)
        return task.result()

    assert run(scenario()) == 7


def test_an_error_the_task_ends_with_on_its_way_out_is_raised() -> None:
    async def cleanup_fails() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("cleanup failed")

    async def scenario() -> None:
        task = asyncio.get_running_loop().create_task(cleanup_fails())
        await asyncio.sleep(0)
        await stop_task(task)

    with pytest.raises(RuntimeError, match="cleanup failed"):
        run(scenario())
