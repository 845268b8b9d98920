"""The console in headless Chromium (Debian's, driven over DevTools:
:mod:`tests.support.chromium`): an operator logs in, sees a FAILED event appear after the
target refuses it, parks it and sees its key flow on, adds a route on the routes page and
re-drives the UNROUTABLE events it matches, watches the live tail show events committed
after it started (paused and resumed); a read-only user is refused an action. The
screenshots of the guide (``docs/operations/console/*.png``) are taken here: into the docs
with ``TIDINGS_CONSOLE_SHOTS=docs`` in the environment, else into a scratch folder (ids and
times change on every run, so a plain test run leaves the committed pictures alone).

The relay's publishing core runs in the test between the steps (no Spark), delivering to a
real event store through :class:`~tests.support.publisher_helpers.Refusing`, the fault a
real target cannot be made to produce: refusing one payload.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path

import pytest

from bench.harness.processes import free_port
from tests.console.harness import PASSWORDS, Deployment, serving, with_servers
from tests.intermediary.serving.test_transport import Rig
from tests.support.chromium import Browser, BrowserError, Page
from tests.support.intermediary_helpers import SMALL
from tidings.console.runner import RunningConsole, close_state, console_state
from tidings.events.model import NewEvent, PayloadKind
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.serving.metrics import IntermediaryMetrics
from tidings.outbox.incomplete import EventFilter
from tidings.streams.consumers.admin import open_store
from tidings.streams.consumers.positions import Consumers

pytestmark = [pytest.mark.anyio, pytest.mark.sockets]

#: The whole walk's bound: a page that never shows what is waited for fails the test.
WAIT_S = 120
SHOTS = (
    Path(__file__).resolve().parents[2] / "docs" / "operations" / "console"
    if os.environ.get("TIDINGS_CONSOLE_SHOTS") == "docs"
    else Path(tempfile.gettempdir()) / "tidings-console-shots"
)


async def _until(page: Page, expression: str) -> None:
    """Wait for ``expression`` to hold, across a navigation (whose old document's context
    goes away mid-call)."""
    while True:
        try:
            if await page.evaluate(expression):
                return
        except BrowserError:
            pass
        await asyncio.sleep(0.05)


async def _go(page: Page, url: str, lands: str | None = None) -> None:
    """Navigate and wait for the new document (at ``lands`` when redirected)."""
    await page.evaluate(
        f"window.__before = true; setTimeout(() => {{ location.href = {json.dumps(url)}; }}, 0);"
        " true"
    )
    await _until(
        page,
        f"!window.__before && location.href === {json.dumps(lands or url)} "
        "&& document.readyState === 'complete'",
    )


async def _submit(page: Page, selector: str, fields: dict[str, str] | None = None) -> None:
    """Fill ``fields`` of the form ``selector`` and submit it; wait for the next page."""
    marker = "window.__before = true; true"
    await page.evaluate(marker)
    fill = "".join(
        f"f.querySelector('[name={name}]').value = {json.dumps(value)};"
        for name, value in (fields or {}).items()
    )
    await page.evaluate(
        f"(() => {{ const f = document.querySelector({json.dumps(selector)}); {fill} "
        "setTimeout(() => f.requestSubmit(), 0); return true; })()"
    )
    await _until(page, "!window.__before && document.readyState === 'complete'")


async def _log_in(page: Page, base: str, user: str) -> None:
    if not await page.evaluate("location.pathname === '/login'"):
        await _go(page, f"{base}/login")
    await _submit(page, "form.login", {"user": user, "password": PASSWORDS[user]})
    who = await page.evaluate("document.getElementById('who').textContent")
    assert who.startswith(user)


async def _shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(SHOTS / f"{name}.png")


async def test_an_operator_finds_and_parks_a_poison_event_and_a_reader_cannot(
    tmp_path: Path,
) -> None:
    deployed = Deployment(
        tmp_path, f"sqlite:///{tmp_path / 'outbox.db'}", port=free_port(), sample_every="200ms"
    )
    browser = await Browser.start(tmp_path / "chromium", width=1100, height=800)
    try:
        async with asyncio.timeout(WAIT_S), serving(deployed) as base:
            page = await browser.open(f"{base}/login")
            # not logged in: the login form, which brings the operator back
            await _go(page, f"{base}/events", f"{base}/login?next=%2Fevents")
            await _shot(page, "login")
            await _log_in(page, base, "olga")

            # a target refuses one event of key k: FAILED, and k's later events held
            deployed.emit(
                [
                    ("orders.placed", "k", {"order": 1}),
                    ("orders.placed", "k", {"order": 2, "note": "poison"}),
                    ("orders.placed", "k", {"order": 3}),
                    ("orders.placed", "m", {"order": 4}),
                    ("payments.made", "p", {"amount": 10}),
                ]
            )
            deployed.relay(runs=3)
            await _go(page, f"{base}/")
            await _until(
                page,  # the page refreshes itself as samples come
                "document.querySelector('[data-status=FAILED] a')?.textContent === '1'",
            )
            assert await page.evaluate("document.getElementById('held-keys').textContent") == "1"
            await _shot(page, "overview")

            # the list, filtered, then the event's own page
            await _go(page, f"{base}/events?status=FAILED")
            rows = await page.evaluate("document.querySelectorAll('[data-event]').length")
            assert rows == 1
            await _shot(page, "events")
            poison = await page.evaluate("document.querySelector('[data-event]').dataset.event")
            await _go(page, f"{base}/events/{poison}")
            assert "poison" in await page.evaluate("document.getElementById('payload').textContent")
            await _shot(page, "event")

            # park it: confirmed, then done
            await _submit(page, "#park", {"reason": "bad order 2, ticket 7"})
            assert await page.evaluate("!!document.getElementById('confirm')")
            await _shot(page, "confirm")
            await _submit(page, "form[action='/act']")
            outcome = await page.evaluate("document.getElementById('outcome').textContent")
            assert outcome.startswith(f"parked {poison}")

            # the relay's next round: k flows on without it
            deployed.relay()
            await _go(page, f"{base}/events?key=k")
            statuses = await page.evaluate(
                "[...document.querySelectorAll('[data-event] .status')].map(e => e.textContent)"
            )
            assert statuses == ["PARKED"]

            # UNROUTABLE payments: add their route on the routes page, then re-drive them
            await _go(page, f"{base}/routes")
            total = await page.evaluate("document.getElementById('unroutable-total').textContent")
            assert total == "1"
            await _shot(page, "routes")
            await _submit(page, "#add-route", {"subject": "payments.*", "target": "store"})
            matching = await page.evaluate("document.getElementById('matching').textContent")
            assert matching.startswith("1 UNROUTABLE event(s) match it")
            await _submit(page, "form[action='/act']")
            outcome = await page.evaluate("document.getElementById('outcome').textContent")
            assert outcome.startswith("payments.* -> store added")
            await _submit(page, "#redrive")
            await _submit(page, "form[action='/act']")
            outcome = await page.evaluate("document.getElementById('outcome').textContent")
            assert outcome.startswith("re-drove 1 UNROUTABLE")
            deployed.relay()
            assert [e.status.value for e in deployed.state.events.find()] == ["PARKED"]
            await _go(page, f"{base}/audit")
            actions = await page.evaluate(
                "[...document.querySelectorAll('#audit td:nth-child(3)')].map(e => e.textContent)"
            )
            assert actions == ["redrive", "route", "park"]
            await _shot(page, "audit")

            # the live tail: events committed after it started, filtered by type
            await _go(page, f"{base}/tail")
            await page.evaluate(
                "document.querySelector('[name=types]').value = 'orders.*';"
                " document.getElementById('start').click(); true"
            )
            await _until(page, "document.getElementById('tail-state').textContent === 'following'")
            deployed.emit([("payments.made", "q", {"n": 1}), ("orders.placed", "t", {"tail": 1})])
            await _until(page, "document.querySelectorAll('#tail [data-position]').length === 1")
            shown = await page.evaluate(
                "document.querySelector('#tail [data-position] td:nth-child(2)').textContent"
            )
            assert shown == "orders.placed"  # the payment was filtered out
            await page.evaluate("document.querySelector('#tail [data-position]').click(); true")
            assert '"tail"' in await page.evaluate(
                "document.getElementById('tail-payload').textContent"
            )
            await page.evaluate("document.getElementById('pause').click(); true")
            deployed.emit([("orders.placed", "t", {"tail": 2})])
            await _until(
                page, "document.getElementById('tail-state').textContent === 'paused (1 waiting)'"
            )
            assert (
                await page.evaluate("document.querySelectorAll('#tail [data-position]').length")
                == 1
            )
            await page.evaluate("document.getElementById('pause').click(); true")
            await _until(page, "document.querySelectorAll('#tail [data-position]').length === 2")
            await _shot(page, "tail")

            # a read-only user: no action offered, and a form sent anyway is refused
            await _submit(page, "form.logout")
            await _log_in(page, base, "rita")
            await _go(page, f"{base}/events/{poison}")
            assert await page.evaluate("!document.getElementById('unpark')")
            await page.evaluate(
                "(() => { const f = document.createElement('form'); f.method = 'post';"
                " f.action = '/act'; for (const [n, v] of Object.entries({action: 'unpark',"
                f" subject: {json.dumps(poison)}, confirmed: 'yes',"
                " csrf: document.querySelector('[name=csrf]').value})) {"
                " const i = document.createElement('input'); i.type = 'hidden'; i.name = n;"
                " i.value = v; f.append(i); } document.body.append(f); window.__before = true;"
                " setTimeout(() => f.submit(), 0); return true; })()"
            )
            await _until(page, "!window.__before && document.readyState === 'complete'")
            refusal = await page.evaluate("document.getElementById('error').textContent")
            assert refusal == "user rita has the read role: only operators may act on events"
            await _shot(page, "refused")
            (still,) = deployed.state.events.find(EventFilter(event_ids=(poison,)))
            assert still.status.value == "PARKED"
    finally:
        await browser.close()
        deployed.close()


async def test_a_reader_finds_the_lagging_consumer_holding_retention_back(
    tmp_path: Path,
) -> None:
    config = with_servers(tmp_path, free_port(), free_port(), retention=True, port=free_port())
    store = open_store(config.servers["main"])
    try:
        consumers = Consumers(store)
        for component in ("billing", "audit", "search"):
            consumers.register("orders", "app", component)
        store.register([NewEvent(("a",), b"{}", PayloadKind.JSON) for _ in range(40)])
        newest = store.last_position()
        consumers.acknowledge("orders", "app", "audit", newest)
        consumers.acknowledge("orders", "app", "search", newest - 2)
    finally:
        store.close()
    assert config.console is not None
    state = console_state(config, config.console)
    browser = await Browser.start(tmp_path / "chromium", width=1100, height=500)
    try:
        running = await RunningConsole.start(state, None)
        try:
            async with asyncio.timeout(WAIT_S):
                base = config.console.url.rstrip("/")
                page = await browser.open(f"{base}/login")
                await _log_in(page, base, "rita")
                await _go(page, f"{base}/streams")
                held = await page.evaluate(
                    "[...document.querySelectorAll('[data-consumer]')]"
                    ".filter(r => r.textContent.includes('holds it back'))"
                    ".map(r => [r.dataset.consumer, r.querySelector('.lag').textContent])"
                )
                assert held == [["app:billing", "40"]]
                assert await page.evaluate("!document.querySelector('[data-consumer] form')")
                await _shot(page, "streams")
        finally:
            await running.aclose()
    finally:
        await browser.close()
        close_state(state)


async def test_a_reader_sees_an_intermediary_s_subscribers_and_its_boxes_drawn(
    tmp_path: Path,
) -> None:
    rig = Rig()
    await rig.server.start()
    metrics = IntermediaryMetrics(rig.server, "127.0.0.1", 0)
    section = {
        "listen": f"127.0.0.1:{rig.server.port}",
        "event_server": f"tcp+sbs://127.0.0.1:{free_port()}",
        "metrics": {"port": metrics.port},
    }
    deployed = Deployment(
        tmp_path,
        f"sqlite:///{tmp_path / 'outbox.db'}",
        {"intermediaries": {"fanout": section}},
        port=free_port(),
    )
    browser = await Browser.start(tmp_path / "chromium", width=1100, height=800)
    subscribers = [await IntermediaryClient.connect(rig.url) for _ in range(3)]
    try:
        await subscribers[0].subscribe("near", SMALL, priority=5, rate_hz=20)
        await subscribers[1].subscribe("corner", {"box": {"lo": [0, 0], "hi": [20, 10]}})
        await subscribers[2].subscribe("east", {"box": {"lo": [70, 60], "hi": [95, 90]}}, rate_hz=5)
        async with asyncio.timeout(WAIT_S), serving(deployed) as base:
            page = await browser.open(f"{base}/login")
            await _log_in(page, base, "rita")
            await _go(page, f"{base}/intermediaries")
            rows = await page.evaluate("document.querySelectorAll('[data-subscriber]').length")
            assert rows == 3
            drawn = await page.evaluate(
                "document.querySelectorAll('svg.boxes rect.coverage').length"
            )
            assert drawn >= 1
            await _shot(page, "intermediaries")
    finally:
        for subscriber in subscribers:
            await subscriber.close()
        metrics.close()
        await rig.server.aclose()
        await browser.close()
        deployed.close()
