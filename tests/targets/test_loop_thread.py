"""The loop thread that targets with asyncio clients run their calls on: a result comes
back to the calling thread, a call its caller gave up on is cancelled, and a stopped loop
starts again on the next call."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from tidings.targets.loop_thread import LoopThread


def test_a_call_runs_on_the_loop_thread_and_returns_its_result() -> None:
    runner = LoopThread("tidings-test-loop")

    async def where() -> str:
        return threading.current_thread().name

    try:
        assert not runner.started
        assert runner.run(where(), 5) == "tidings-test-loop"
        assert runner.started
    finally:
        runner.stop()
    assert not runner.started


def test_a_call_past_its_timeout_is_cancelled() -> None:
    runner = LoopThread("tidings-test-loop")
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        with pytest.raises(concurrent.futures.TimeoutError):
            runner.run(forever(), 0.05)
        assert cancelled.wait(5)
    finally:
        runner.stop()


def test_a_stopped_loop_starts_again_on_the_next_call() -> None:
    runner = LoopThread("tidings-test-loop")

    async def answer() -> int:
        return 42

    runner.run(answer(), 5)
    runner.stop()
    try:
        assert runner.run(answer(), 5) == 42
    finally:
        runner.stop()
