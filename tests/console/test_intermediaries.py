"""The intermediaries page: one without a metrics endpoint and one whose endpoint does not
answer are each said so; a running intermediary's subscribers listed and its boxes drawn
(its figures under ``tidings run`` are in ``test_runner.py``)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from bench.harness.processes import free_port
from tests.console.harness import Deployment, log_in
from tests.intermediary.serving.test_transport import WAIT, Rig
from tests.support.intermediary_helpers import SMALL
from tidings.config import load_config
from tidings.console.drawing import draw
from tidings.console.intermediaries import read_intermediaries
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.serving.metrics import IntermediaryMetrics


def test_an_intermediary_without_or_with_a_silent_endpoint_is_said_so() -> None:
    def section(**extra: object) -> dict[str, object]:
        return {
            "listen": f"127.0.0.1:{free_port()}",
            "event_server": f"tcp+sbs://127.0.0.1:{free_port()}",
            **extra,
        }

    config = load_config(
        {
            "intermediaries": {
                "plain": section(),
                "silent": section(metrics={"port": free_port()}),
            }
        }
    )
    views = {v.name: v for v in read_intermediaries(config)}
    assert views["intermediary.plain"].problem.startswith("no metrics endpoint")
    assert views["intermediary.silent"].problem.startswith("its metrics endpoint did not answer")
    assert not views["intermediary.silent"].figures


@pytest.mark.sockets
def test_the_page_shows_each_subscriber_and_draws_the_boxes_then_says_when_it_is_down(
    tmp_path: Path,
) -> None:
    """A real intermediary (a simulation upstream) with its metrics listener and two real
    subscribers: the page lists them (identity, address, subscriptions, rate, priority) and
    draws its world and upstream boxes; stopped, the page says its endpoint is not
    answering."""

    async def main() -> None:
        rig = Rig()
        await rig.server.start()
        metrics = IntermediaryMetrics(rig.server, "127.0.0.1", 0)
        section = {
            "listen": f"127.0.0.1:{rig.server.port}",
            "event_server": f"tcp+sbs://127.0.0.1:{free_port()}",
            "metrics": {"port": metrics.port},
        }
        deployed = Deployment(
            tmp_path, f"sqlite:///{tmp_path / 'outbox.db'}", {"intermediaries": {"live": section}}
        )
        try:
            a = await IntermediaryClient.connect(rig.url)
            await a.subscribe("near", SMALL, priority=5, rate_hz=20)
            b = await IntermediaryClient.connect(rig.url)
            await b.subscribe("corner", {"box": {"lo": [0, 0], "hi": [20, 10]}}, rate_hz=50)
            async with deployed.client() as client:
                await log_in(client, "rita")
                page = (await client.get("/intermediaries")).text
                assert 'data-intermediary="intermediary.live"' in page
                assert "problem" not in page
                rows = re.findall(r'<tr data-subscriber="(\d+)">(.*?)</tr>', page, re.S)
                assert len(rows) == 2
                cells = [re.findall(r"<td>(.*?)</td>", row, re.S) for _, row in rows]
                assert [c[1] for c in cells] == ["anonymous", "anonymous"]
                assert all(c[2].startswith("127.0.0.1:") for c in cells)
                assert "<code>near</code> region sphere 15.0,25.0 to 45.0,55.0" in cells[0][3]
                assert (cells[0][4], cells[0][5]) == ("20", "5")
                assert "<code>corner</code> region box 0.0,0.0 to 20.0,10.0" in cells[1][3]
                assert (cells[1][4], cells[1][5]) == ("50", "0")
                svg = re.search(r'<svg class="boxes".*?</svg>', page, re.S)
                assert svg is not None
                assert 'viewBox="0 0 300.0 300.0"' in svg.group(0)  # the 100 x 100 world
                assert svg.group(0).count('class="coverage"') >= 1
                assert "<code>subscribers</code></td><td>2</td>" in page
                await a.close()
                await b.close()
                metrics.close()
                await rig.server.aclose()
                down = (await client.get("/intermediaries")).text
                assert "its metrics endpoint did not answer" in down
                assert "data-subscriber" not in down
        finally:
            deployed.close()

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_the_drawing_puts_the_tier_s_areas_and_the_coverage_on_the_world() -> None:
    status = {
        "subscribers": [],
        "world": None,
        "coverage": {"boxes": [{"lo": [0, 50], "hi": [50, 100]}], "more": 0},
        "responsibility": {
            "member": "m0",
            "partition": "region",
            "slots": 2,
            "owners": {"m0": 1, "m1": 1},
            "world": {"lo": [0, 0], "hi": [100, 100]},
            "areas": {
                "m0": {"boxes": [{"lo": [0, 0], "hi": [50, 100]}], "more": 0},
                "m1": {"boxes": [{"lo": [50, 0], "hi": [100, 100]}], "more": 0},
            },
        },
    }
    drawing = draw(status)
    assert drawing is not None and (drawing.width, drawing.height) == (300.0, 300.0)
    rects = [(r.kind, r.x, r.y, r.width, r.height) for r in drawing.rects]
    assert rects == [
        ("area", 0.0, 0.0, 150.0, 300.0),
        ("area", 150.0, 0.0, 150.0, 300.0),
        ("coverage", 0.0, 0.0, 150.0, 150.0),  # the world's upper half: y flipped
    ]
    assert [who for _, who in drawing.legend] == ["m0 (this one)", "m1"]
    assert draw({"subscribers": [], "world": None, "coverage": {"boxes": []}}) is None
