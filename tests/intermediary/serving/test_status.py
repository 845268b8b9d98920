"""An intermediary's ``/status`` (on its metrics listener): per subscriber its identity,
address, subscriptions, rate, priority, last serve, dropped frames and queued bytes, the
boxes it asks upstream for and its upstreams' staleness, over real sockets with real
subscribers; bounded (the list is capped and says how many more); no secret in it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

import tidings.intermediary.serving.status as status_module
from tests.intermediary.serving.test_metrics import ACCESS, PASSWORD, TOKEN, _chained, _run
from tests.intermediary.serving.test_transport import WAIT, Rig, until
from tests.support.intermediary_helpers import SMALL
from tidings.client import json_event
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.serving.access import Gatekeeper
from tidings.intermediary.serving.credentials import Credentials
from tidings.intermediary.serving.metrics import IntermediaryMetrics

pytestmark = pytest.mark.sockets

BOX = {"box": {"lo": [0, 0], "hi": [20, 10]}}


async def status(metrics: IntermediaryMetrics) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        reply = await http.get(f"http://127.0.0.1:{metrics.port}/status", timeout=WAIT)
    reply.raise_for_status()
    assert reply.headers["content-type"] == "application/json"
    found: dict[str, Any] = reply.json()
    return found


def test_status_lists_each_region_subscriber_and_the_upstream_boxes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def body(rig: Rig) -> None:
        metrics = IntermediaryMetrics(rig.server, "127.0.0.1", 0)
        try:
            empty = await status(metrics)
            assert empty["subscribers"] == [] and empty["more_subscribers"] == 0
            assert empty["world"] == {"lo": [0.0, 0.0], "hi": [100.0, 100.0]}
            assert empty["responsibility"] is None and empty["upstreams"] == {}

            a = await IntermediaryClient.connect(rig.url)
            await a.subscribe("near", SMALL, priority=5, rate_hz=20)
            await a.subscribe("corner", BOX, priority=2, rate_hz=20)
            b = await IntermediaryClient.connect(rig.url)
            await b.subscribe("k", BOX, rate_hz=50)
            async for _ in a.frames():
                break
            found = await status(metrics)
            first, second = found["subscribers"]
            assert first["identity"] == second["identity"] == "anonymous"
            assert first["address"].startswith("127.0.0.1:")
            assert first["rate_hz"] == 20 and first["priority"] == 5
            assert second["rate_hz"] == 50 and second["priority"] == 0
            assert first["subscriptions"] == [
                {
                    "kind": "region",
                    "key": "corner",
                    "priority": 2.0,
                    "shape": "box",
                    "bounds": {"lo": [0.0, 0.0], "hi": [20.0, 10.0]},
                },
                {
                    "kind": "region",
                    "key": "near",
                    "priority": 5.0,
                    "shape": "sphere",
                    "bounds": {"lo": [15.0, 25.0], "hi": [45.0, 55.0]},
                },
            ]
            assert first["last_served_s_ago"] >= 0
            assert first["dropped_frames"] >= 0 and first["queued_bytes"] >= 0
            boxes = found["coverage"]["boxes"]
            assert boxes and found["coverage"]["more"] == 0
            for want in ((0, 0, 20, 10), (15, 25, 45, 55)):  # each region's bounds covered
                assert any(
                    b["lo"][0] <= want[0]
                    and b["lo"][1] <= want[1]
                    and b["hi"][0] >= want[2]
                    and b["hi"][1] >= want[3]
                    for b in boxes
                ) or _covered_by_union(boxes, want)

            monkeypatch.setattr(status_module, "MAX_SUBSCRIBERS", 1)
            capped = await status(metrics)
            assert [s["id"] for s in capped["subscribers"]] == [first["id"]]
            assert capped["more_subscribers"] == 1
            await b.close()
            await until(lambda: len(rig.server.connections) == 1)
            assert (await status(metrics))["more_subscribers"] == 0
            await a.close()
        finally:
            metrics.close()

    _run(body)


def _covered_by_union(boxes: list[dict[str, list[float]]], want: tuple[int, ...]) -> bool:
    """Is the rectangle ``want`` inside the union of ``boxes`` (checked on a 1-unit grid)?"""
    x0, y0, x1, y1 = want
    return all(
        any(
            b["lo"][0] <= x + 0.5 <= b["hi"][0] and b["lo"][1] <= y + 0.5 <= b["hi"][1]
            for b in boxes
        )
        for x in range(x0, x1)
        for y in range(y0, y1)
    )


def test_status_names_identities_and_their_event_and_view_subscriptions_never_secrets(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with _chained(tmp_path, Gatekeeper.from_config(ACCESS)) as (rig, producer, metrics):
            ops = await rig.client(credentials=Credentials(user="ops", password=PASSWORD))
            dash = await rig.client(credentials=Credentials(token=TOKEN))
            await dash.subscribe_events("a", [["app", "*"]])
            await ops.subscribe_sql("v", "SELECT id FROM users", priority=3, rate_hz=4)
            await producer.register([json_event(("app", "x"), "hello")])
            while (await dash.message(WAIT)).get("payload") != "hello":
                pass
            async with httpx.AsyncClient() as http:
                text = (await http.get(f"http://127.0.0.1:{metrics.port}/status")).text
            assert TOKEN not in text and PASSWORD not in text
            found = await status(metrics)
            by_identity = {s["identity"]: s for s in found["subscribers"]}
            assert by_identity["dash"]["subscriptions"] == [
                {"kind": "event", "key": "a", "types": ["app/*"]}
            ]
            (view,) = by_identity["ops"]["subscriptions"]
            assert view.pop("dropped_frames") >= 0
            assert view == {
                "kind": "view",
                "key": "v",
                "tables": ["users"],
                "priority": 3.0,
                "rate_hz": 4.0,
            }
            assert by_identity["ops"]["priority"] == 3 and by_identity["dash"]["priority"] is None
            assert by_identity["ops"]["rate_hz"] == 4
            assert found["upstreams"] == {"event_server": {"stale": False, "why": None}}
            assert found["coverage"] == {"boxes": [], "more": 0}
            await dash.close()
            await ops.close()

    asyncio.run(asyncio.wait_for(main(), WAIT))
