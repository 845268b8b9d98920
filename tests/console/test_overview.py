"""The overview's snapshot of the parts: a server up (its port accepts) or down, one that
``tidings run`` is bringing back (*restarting*, with its restarts), and a stream's
consumers with how far behind each is, read from the server's store."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import httpx
import pytest

from bench.harness.processes import free_port
from tests.console.harness import log_in, with_servers
from tidings.console.app import build_app
from tidings.console.overview import take_overview
from tidings.console.runner import close_state, console_state
from tidings.db import make_engine
from tidings.events.model import NewEvent, PayloadKind
from tidings.streams.consumers.admin import open_store
from tidings.streams.consumers.positions import Consumers
from tidings.system.state import RunFiles, write_state


def test_servers_up_down_and_restarting_and_a_consumer_behind(tmp_path: Path) -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = listening.getsockname()[1]
        config = with_servers(tmp_path, up, free_port())
        store = open_store(config.servers["main"])
        try:
            Consumers(store).register("orders", "app", "billing")
            store.register([NewEvent(("a",), b"{}", PayloadKind.JSON) for i in range(3)])
        finally:
            store.close()
        path = tmp_path / "tidings.yaml"
        files = RunFiles.of(path)
        files.directory.mkdir(parents=True)
        parts = {
            "server.main": {"state": "up", "restarts": 0},
            "server.spare": {"state": "starting", "restarts": 2},
        }
        write_state(files, {"supervisor_pid": os.getpid(), "parts": parts})
        engine = make_engine(config.database.url)
        overview = take_overview(config, path, engine)
        engine.dispose()
    assert overview.problems == []
    assert overview.supervised
    states = {p.name: (p.state, p.restarts) for p in overview.parts}
    assert states == {"server.main": ("up", 0), "server.spare": ("restarting", 2)}
    (orders,) = overview.streams["main"]
    (billing,) = orders.consumers
    assert (billing.component, billing.behind) == ("billing", 3)
    assert overview.at <= time.time()


def test_a_server_down_without_a_supervisor_is_down(tmp_path: Path) -> None:
    config = with_servers(tmp_path, free_port(), free_port())
    engine = make_engine(config.database.url)
    overview = take_overview(config, tmp_path / "tidings.yaml", engine)
    engine.dispose()
    assert not overview.supervised
    assert {p.name: p.state for p in overview.parts} == {
        "server.main": "down",
        "server.spare": "down",
    }


@pytest.mark.anyio
async def test_the_streams_page_shows_who_holds_retention_back_and_unregisters_it(
    tmp_path: Path,
) -> None:
    config = with_servers(tmp_path, free_port(), free_port(), retention=True)
    store = open_store(config.servers["main"])
    try:
        consumers = Consumers(store)
        consumers.register("orders", "app", "billing")
        consumers.register("orders", "app", "audit")
        store.register([NewEvent(("a",), b"{}", PayloadKind.JSON) for _ in range(3)])
        consumers.acknowledge("orders", "app", "audit", store.last_position())
    finally:
        store.close()
    assert config.console is not None
    state = console_state(config, config.console)
    transport = httpx.ASGITransport(app=build_app(state))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            csrf = await log_in(client, "olga")
            page = (await client.get("/streams")).text
            billing = page[page.index('data-consumer="app:billing"') :]
            assert "<strong>holds it back</strong>" in billing.split("</tr>")[0]
            audit = page[page.index('data-consumer="app:audit"') :]
            assert "holds it back" not in audit.split("</tr>")[0]
            asked = {
                "csrf": csrf,
                "action": "unregister",
                "subject": "main/orders/billing",
                "target": "app",
            }
            assert 'id="confirm"' in (await client.post("/act", data=asked)).text
            done = (await client.post("/act", data={**asked, "confirmed": "yes"})).text
            assert "app:billing of orders unregistered" in done
            assert 'data-consumer="app:billing"' not in (await client.get("/streams")).text
            bad = await client.post(
                "/act", data={**asked, "subject": "main/orders/LIVE", "confirmed": "yes"}
            )
            assert bad.status_code == 400 and "is not a consumer component" in bad.text
        (entry, refused) = state.audit.newest()[::-1]
        assert (entry.action, entry.target) == ("unregister", "main/orders/billing app")
        assert "error" in refused.detail
    finally:
        close_state(state)
