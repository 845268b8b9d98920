"""A round's frames are generated off the serving loop (issue 30): while a generation is
under way, the loop that serves every connection answers requests and sends what waits;
the round's frames follow once it is done. Over real sockets with the real server; the
generation is held by the test (a generation as slow as the test wants: no real one is
that slow on demand). No test asserts timings: waits are bounded only so that a broken
build fails instead of hanging."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.intermediary.serving.test_transport import Rig, run
from tests.support.intermediary_helpers import SMALL, WHOLE
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.node.generation import Frame
from tidings.intermediary.node.intermediary import Intermediary, RoundPlan

pytestmark = pytest.mark.sockets


class _HeldPlan(RoundPlan):
    gate: threading.Event
    started: threading.Event
    finished: threading.Event

    def generate(self) -> list[Frame]:
        self.started.set()
        self.gate.wait(20)
        self.finished.set()
        return super().generate()


def test_requests_are_answered_while_a_round_is_being_generated() -> None:
    gate, started, finished = threading.Event(), threading.Event(), threading.Event()

    def held_plans(node: Intermediary) -> None:
        plan_round = node.plan_round

        def plan(now: float, budget: int) -> RoundPlan:
            made = plan_round(now, budget)
            if not made.views:
                return made
            held = _HeldPlan(made.snapshot, made.views, made.pending, made.grid)
            object.__setattr__(held, "gate", gate)
            object.__setattr__(held, "started", started)
            object.__setattr__(held, "finished", finished)
            return held

        node.plan_round = plan  # type: ignore[method-assign]

    async def body(rig: Rig) -> None:
        held_plans(rig.node)
        first = await IntermediaryClient.connect(rig.url)
        await first.subscribe("all", WHOLE, rate_hz=50)
        while not started.is_set():  # a round with its frame is being generated, held
            await asyncio.sleep(0.01)
        second = await IntermediaryClient.connect(rig.url)  # handshake and hello: the loop
        reply = await second.subscribe("small", SMALL)
        assert reply["op"] == "subscribed"
        assert not finished.is_set()  # all of it while the generation was still held
        gate.set()
        async for frame in first.frames():
            assert frame.key == "all"
            break
        await first.close()
        await second.close()

    run(body)
