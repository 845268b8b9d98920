"""The live-view web page (issue 12 item 8) in headless Chromium, against a real intermediary
on a real socket fed by the simulation: what the page decoded and drew is compared with the
brute-force selection at the frame's epoch, the map moves, and the server's errors and close
reasons are shown. Each run writes screenshots (PNG) to the test's tmp_path for a look. No
test asserts timings: waits are bounded only so that a broken build fails instead of
hanging."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.intermediary.serving.test_transport import WAIT, Rig, until
from tests.support.chromium import Browser, Page
from tests.support.intermediary_helpers import WHOLE, inside
from tidings.errors import IntermediaryError
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.regions.geometry import parse_region
from tidings.intermediary.serving.transport import TransportLimits

pytestmark = pytest.mark.sockets

#: What the page holds and shows, read in one task (so the canvas is the one the last frame
#: drew), with how many of the last frame's entities have the entity colour at their pixel.
SNAPSHOT = """(() => {
  const view = window.tidingsView, frame = view.last;
  const ctx = document.getElementById("map").getContext("2d");
  const colour = (hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  const pixel = ([x, y]) => Array.from(ctx.getImageData(Math.floor(x), Math.floor(y), 1, 1).data);
  const same = (p, c) => c.every((v, i) => p[i] === v);
  const entity = colour(view.colours.entity);
  let drawn = 0;
  for (let i = 0; i < frame.ids.length; i++) {
    const at = [frame.positions[i * frame.dim], frame.positions[i * frame.dim + 1]];
    if (same(pixel(view.project(...at)), entity)) drawn++;
  }
  return {
    kind: frame.kind, epoch: frame.epoch, dim: frame.dim, ids: frame.ids,
    positions: Array.from(frame.positions), origin: frame.origin, drawn,
    corner: same(pixel([0, 0]), colour(view.colours.background)),
    status: document.getElementById("status").textContent, error: view.error,
  };
})()"""

#: Queries and the subscription each stands for (in the transport tests' wire form).
ABSOLUTE = (
    "box=20,30,60,70&float32=0&rate_hz=50",
    {"box": {"lo": [20, 30], "hi": [60, 70]}},
)
AROUND_7 = (
    "relative_to=7&sphere=20&compress=1&rate_hz=50",
    {"sphere": {"center": [0, 0], "radius": 20}, "relative_to": 7},
)


def run(tmp_path: Path, body: Any, **options: Any) -> None:
    """``body(rig, browser)`` with a served intermediary and a headless Chromium."""

    async def main() -> None:
        rig = Rig(**options)
        await rig.server.start()
        try:
            browser = await Browser.start(tmp_path / "profile")
            try:
                await asyncio.wait_for(body(rig, browser), WAIT)
            finally:
                await browser.close()
        finally:
            await rig.server.aclose()

    asyncio.run(main())


def page_url(rig: Rig, query: str) -> str:
    return f"http://127.0.0.1:{rig.server.port}/view?{query}"


async def snapshot_after(page: Page, epoch: int) -> dict[str, Any]:
    """The page's state once it has drawn entities of an epoch after ``epoch`` (a relative
    view is EMPTY until its entity is in the intermediary's state)."""
    drawn = f"window.tidingsView?.last?.kind === 'VIEW' && window.tidingsView.last.epoch > {epoch}"
    outcome = await page.wait_for(f"window.tidingsView?.error || ({drawn} && 'drawn')")
    assert outcome == "drawn", f"the page shows an error: {outcome}"
    return await page.evaluate(SNAPSHOT)


def check_against_reference(
    rig: Rig, spec: dict[str, Any], seen: dict[str, Any], nearest: tuple[int, Any] | None = None
) -> None:
    """What the page decoded is the brute-force selection at its epoch (with ``nearest =
    (n, point)``: its ``n`` entities nearest ``point``, as a capped frame holds), and it is
    drawn."""
    positions = rig.history[seen["epoch"]]
    ids = np.array(seen["ids"], dtype=np.int64)
    expected = np.flatnonzero(inside(positions, spec))
    if nearest is not None:
        count, point = nearest
        distance = np.linalg.norm(positions[expected] - np.asarray(point), axis=1)
        expected = np.sort(expected[np.argsort(distance)[:count]])
        assert "truncated" in seen["status"]
    np.testing.assert_array_equal(ids, expected)
    assert len(ids) > 0, "the region should hold agents for the test to mean something"
    world = np.array(seen["positions"]).reshape(-1, seen["dim"])
    if seen["origin"] is not None:
        np.testing.assert_allclose(seen["origin"], positions[spec["relative_to"]])
        world = world + np.array(seen["origin"])
    np.testing.assert_allclose(world, positions[ids], atol=1e-3)
    assert seen["drawn"] == len(ids), "every entity of the frame is drawn at its place"
    assert seen["corner"], "and the canvas is not one colour"
    assert f"epoch {seen['epoch']}" in seen["status"]
    assert f"{len(ids)} entities" in seen["status"]
    assert seen["error"] is None


@pytest.mark.parametrize("query, spec", [ABSOLUTE, AROUND_7], ids=["absolute", "relative"])
def test_the_page_shows_what_a_brute_force_selection_holds_and_the_map_moves(
    tmp_path: Path, query: str, spec: dict[str, Any]
) -> None:
    async def body(rig: Rig, browser: Browser) -> None:
        # A relative view is placed once its entity is in the intermediary's state, which
        # holds only what some subscription covers: another subscriber watches the world.
        watcher = await IntermediaryClient.connect(rig.url)
        await watcher.subscribe("whole", WHOLE, rate_hz=1)
        page = await browser.open(page_url(rig, query))
        first = await snapshot_after(page, 0)
        check_against_reference(rig, spec, first)
        later = await snapshot_after(page, first["epoch"] + 10)
        check_against_reference(rig, spec, later)
        # The map moves: the same agents are elsewhere, and a relative view's origin too.
        both = np.intersect1d(first["ids"], later["ids"])
        assert len(both) > 0
        assert not np.allclose(rig.history[first["epoch"]][both], rig.history[later["epoch"]][both])
        if first["origin"] is not None:
            assert first["origin"] != later["origin"]
        assert "frames/s" in later["status"]
        png = await page.screenshot(tmp_path / "view.png")
        assert png.startswith(b"\x89PNG")
        await watcher.close()

    run(tmp_path, body)


def server_message(region: dict[str, Any]) -> str:
    """What the server says of ``region`` (the page must show exactly this)."""
    with pytest.raises(IntermediaryError) as refused:
        parse_region(region)
    return str(refused.value)


def test_the_page_shows_the_servers_errors_and_close_reason(tmp_path: Path) -> None:
    async def body(rig: Rig, browser: Browser) -> None:
        bad = [
            ("box=0,0,-5,10", server_message({"box": {"lo": [0, 0], "hi": [-5, 10]}})),
            ("sphere=0,0,abc", server_message({"sphere": {"center": [0, 0], "radius": "abc"}})),
            (
                "sphere=50,50,1e300",
                server_message({"sphere": {"center": [50, 50], "radius": 1e300}}),
            ),
        ]
        for query, message in bad:
            page = await browser.open(page_url(rig, query))
            shown = await page.wait_for("document.getElementById('error').textContent")
            assert shown == f"error: {message}"
            assert "refused" in await page.evaluate("document.getElementById('status').textContent")
            await page.close()
            await until(lambda: not rig.server.connections)
        assert rig.node.publishers.subscribers() == []

        page = await browser.open(page_url(rig, "bogus=1"))
        shown = await page.wait_for("document.getElementById('error').textContent")
        assert "unknown parameter 'bogus'" in shown
        await page.close()

        # The server is full (one connection): the page shows the close code and reason.
        async with await IntermediaryClient.connect(rig.url):
            page = await browser.open(page_url(rig, ""))
            closed = await page.wait_for("window.tidingsView?.closed")
            assert closed == {"code": 1013, "reason": "too many connections"}
            status = await page.evaluate("document.getElementById('status').textContent")
            assert "closed (1013 too many connections)" in status
            await page.screenshot(tmp_path / "view-closed.png")

    run(tmp_path, body, limits=TransportLimits(max_connections=1))


def test_a_bare_page_shows_the_whole_world_and_a_capped_one_what_is_nearest(
    tmp_path: Path,
) -> None:
    async def body(rig: Rig, browser: Browser) -> None:
        page = await browser.open(page_url(rig, ""))
        seen = await snapshot_after(page, 0)
        world = rig.node.subscriptions.world
        assert world is not None
        spec = {"box": {"lo": list(world.lo), "hi": list(world.hi)}}
        check_against_reference(rig, spec, seen)
        assert len(seen["ids"]) == len(rig.sim.ids)
        assert "truncated" not in seen["status"]

        capped = await browser.open(page_url(rig, "max_entities=5"))
        seen = await snapshot_after(capped, 0)
        middle = (np.array(world.lo) + np.array(world.hi)) / 2
        check_against_reference(rig, spec, seen, nearest=(5, middle))

    run(tmp_path, body, n=2500)  # more than the page draws as circles
