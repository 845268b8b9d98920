"""``stop_task``: a background task is cancelled and waited for; its cancellation is the
expected end and is swallowed, any other error it ends with is not."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.waiting import run
from tidings.tasks import Backoff, stop_task


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


def test_backoff_doubles_to_its_cap_with_jitter_below_and_starts_over_after_reset() -> None:
    backoff = Backoff(first=0.1, cap=0.5, jitter=0.2)
    delays = [backoff.next_delay() for _ in range(5)]
    for delay, nominal in zip(delays, [0.1, 0.2, 0.4, 0.5, 0.5], strict=True):
        assert nominal * 0.8 <= delay <= nominal
    backoff.reset()
    assert backoff.next_delay() <= 0.1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"first": 0.0}, "expected 0 < first <= cap"),
        ({"first": 2.0, "cap": 1.0}, "expected 0 < first <= cap"),
        ({"jitter": 1.0}, r"jitter must be in \[0, 1\)"),
    ],
)
def test_a_bad_backoff_is_refused_naming_why(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Backoff(**options)
