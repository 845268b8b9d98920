"""A deployed tier's metrics (issue 30): each member, in its own process, serves its own
/metrics at the configured port plus its seat's index, as an operator runs it (a
``tidings intermediary simulate`` publisher and ``tidings intermediary serve --tier``, real
subprocesses and sockets). Waits are bounded so a broken build fails instead of hanging."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from tests.intermediary.cluster.test_tier import end, first_line, free_ports, start, tier_file
from tests.support.waiting import run

pytestmark = pytest.mark.sockets


def _consecutive_free_ports(n: int) -> int:
    """The first of ``n`` consecutive free ports of 127.0.0.1."""
    for _ in range(100):
        (first,) = free_ports(1)
        try:
            for port in range(first, first + n):
                with socket.create_server(("127.0.0.1", port)):
                    pass
        except OSError:
            continue
        return first
    raise AssertionError("no consecutive free ports")


async def _refusals(port: int) -> dict[str, float]:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics", timeout=30)).text
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "tidings_intermediary_refusals_total"
    }


@pytest.mark.slow
def test_each_member_serves_its_own_metrics(tmp_path: Path) -> None:
    feed_port, *ports = free_ports(3)
    metrics = _consecutive_free_ports(2)
    path = tier_file(tmp_path, feed_port, ports, {"metrics": {"port": metrics}})
    publisher = start("intermediary", "simulate", "--listen", f"127.0.0.1:{feed_port}")
    tier = None

    async def main() -> tuple[dict[str, float], dict[str, float]]:
        async with websockets.connect(f"ws://127.0.0.1:{ports[1]}/") as raw:
            await raw.recv()  # hello
            await raw.send(b"\x00")  # not a JSON text request: refused at member 1 only
            await raw.recv()
        return await _refusals(metrics), await _refusals(metrics + 1)

    async def statuses() -> list[dict[str, Any]]:
        async with httpx.AsyncClient() as http:
            return [
                (await http.get(f"http://127.0.0.1:{port}/status", timeout=30)).json()
                for port in (metrics, metrics + 1)
            ]

    try:
        first_line(publisher, "simulation of")
        tier = start("intermediary", "serve", "-c", str(path), "--tier", "world")
        first_line(tier, "intermediary tier world serving")
        zero, one = run(main(), 60)
        split = [status["responsibility"] for status in run(statuses(), 60)]
    finally:
        end(tier, publisher)
    assert zero["malformed"] == 0 and one["malformed"] == 1
    assert set(zero) == set(one) and "too_many_from_address" in zero
    # Each member's /status: itself, and the tier's split of the world's cells.
    assert split[0]["member"] != split[1]["member"]
    slots = split[0]["slots"]
    for one in split:
        assert one["partition"] == "region" and one["slots"] == slots > 1
        assert sum(one["owners"].values()) == slots and one["member"] in one["owners"]
        assert set(one["owners"]) == {split[0]["member"], split[1]["member"]}
        assert one["world"] == split[0]["world"]
        cells = [box for areas in one["areas"].values() for box in areas["boxes"]]
        assert len(cells) == slots and len({str(box) for box in cells}) == slots
