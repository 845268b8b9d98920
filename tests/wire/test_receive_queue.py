"""A connection's receive queue gives every message received before the end, in order."""

from __future__ import annotations

import asyncio
import contextlib

from tests.support.waiting import run
from tidings.wire.receive_queue import ReceiveQueue


async def _drain(queue: ReceiveQueue[int]) -> list[int | None]:
    taken: list[int | None] = []
    while True:
        item = await queue.get()
        taken.append(item)
        if item is None:
            return taken


def test_a_full_queue_ended_still_yields_every_item_then_the_end() -> None:
    """The end of a connection whose queue is full (its peer went away while the receiver
    was behind): nothing received may be dropped, least of all from the middle."""

    async def main() -> tuple[list[int | None], int | None]:
        queue: ReceiveQueue[int] = ReceiveQueue(max_items=4, max_bytes=1 << 20)
        for n in range(4):
            await queue.put(n, 1)  # full in number, as a reader leaves it
        assert queue.paused
        queue.end()
        taken = await _drain(queue)
        return taken, await queue.get()

    taken, again = run(main())
    assert taken == [0, 1, 2, 3, None]
    assert again is None


def test_the_end_wakes_a_waiting_receiver_after_the_items() -> None:
    async def main() -> list[int | None]:
        queue: ReceiveQueue[int] = ReceiveQueue(max_items=10, max_bytes=1 << 20)
        receiver = asyncio.ensure_future(_drain(queue))
        await queue.put(1, 1)
        await queue.put(2, 1)
        await asyncio.sleep(0)
        queue.end()
        return await receiver

    assert run(main()) == [1, 2, None]


def test_a_put_over_the_byte_bound_waits_until_the_receiver_takes_enough() -> None:
    async def main() -> tuple[bool, bool, list[int | None]]:
        queue: ReceiveQueue[int] = ReceiveQueue(max_items=10, max_bytes=100)
        await queue.put(1, 60)
        putting = asyncio.ensure_future(queue.put(2, 60))  # 120 bytes queued: over the bound
        await asyncio.sleep(0)
        waited = not putting.done() and queue.paused
        assert queue.get_nowait() == 1  # 60 bytes left: room again
        await asyncio.wait_for(putting, 10)
        queue.end()
        return waited, queue.paused, await _drain(queue)

    waited, paused, rest = run(main())
    assert waited and not paused
    assert rest == [2, None]


def test_a_receiver_that_gives_up_again_and_again_leaves_nothing_behind() -> None:
    """A receive with a timeout, repeated while nothing comes: each wait is forgotten when
    it is cancelled, and the next item still reaches the next receive."""

    async def main() -> int | None:
        queue: ReceiveQueue[int] = ReceiveQueue(max_items=10, max_bytes=1 << 20)
        for _ in range(100):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(queue.get(), 0.001)
        assert not queue._getters
        await queue.put(7, 1)
        return await queue.get()

    assert run(main()) == 7


def test_a_frame_over_the_byte_bound_put_into_a_queue_full_in_number_goes_in() -> None:
    """A queue full in number, and the next frame larger than the byte bound on its own (a
    64 MiB frame may come to a 16 MiB queue): taking the queued items lets it in. Counting
    its bytes before it was queued once left the reader waiting for ever."""

    async def main() -> list[int | None]:
        queue: ReceiveQueue[int] = ReceiveQueue(max_items=2, max_bytes=100)
        await queue.put(1, 10)
        await queue.put(2, 10)
        putting = asyncio.ensure_future(queue.put(3, 500))
        taken = [await queue.get(), await queue.get(), await queue.get()]
        queue.end()
        await asyncio.wait_for(putting, 10)
        return [*taken, await queue.get()]

    assert run(main(), 30) == [1, 2, 3, None]


def test_awaited_only_while_a_receiver_waits_with_nothing_queued() -> None:
    async def main() -> list[bool]:
        queue: ReceiveQueue[int] = ReceiveQueue(max_items=10, max_bytes=1 << 20)
        seen = [queue.awaited]  # nobody waits
        receiver = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)
        seen.append(queue.awaited)  # it waits, nothing queued
        await queue.put(1, 1)
        seen.append(queue.awaited)  # woken, the item not taken yet
        assert await receiver == 1
        seen.append(queue.awaited)
        return seen

    assert run(main()) == [False, True, False, False]


def test_put_ready_queues_only_what_put_would_queue_without_waiting() -> None:
    async def main() -> list[int | None]:
        queue: ReceiveQueue[int] = ReceiveQueue(max_items=2, max_bytes=10)
        assert queue.put_ready(1, 4)
        assert not queue.put_ready(2, 7)  # over the byte bound: left to put()
        assert queue.put_ready(2, 6)
        assert not queue.put_ready(3, 0)  # full in number
        assert await queue.get() == 1
        assert queue.put_ready(3, 4)
        queue.end()
        return await _drain(queue)

    assert run(main()) == [2, 3, None]
