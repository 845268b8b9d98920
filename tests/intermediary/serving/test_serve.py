"""``tidings intermediary serve`` as an operator runs it: a real ``tidings server`` in a
subprocess, the intermediary in another, a subscriber over a real WebSocket, events and row
events registered with the public client, its page /live in headless Chromium; bad
configuration, an address in use and an event server that is not there (or goes away) end it
with one line and exit code 2."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from bench.harness.processes import (
    ServerProcess,
    free_port,
    local_address,
    tidings_cli,
    wait_for_port,
)
from tests.support.chromium import Browser, Page
from tests.support.waiting import run
from tidings import client
from tidings.cli import app
from tidings.config import load_config_file
from tidings.errors import IntermediaryError
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.serving.service import catalog_of

pytestmark = pytest.mark.sockets

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "intermediary.yaml"
TABLES = {"users": {"columns": {"id": "integer", "name": "text", "city": "text"}, "keyed_by": "id"}}


@pytest.fixture
def event_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess.tidings(tmp_path / "server", 1, {"eventer": free_port()})
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _config(tmp_path: Path, **section: Any) -> Path:
    path = tmp_path / "tidings.yaml"
    path.write_text(yaml.safe_dump({"intermediary": section}))
    return path


def _serve(config: Path) -> subprocess.Popen[bytes]:
    return tidings_cli(
        "intermediary", "serve", "-c", str(config), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _stop(proc: subprocess.Popen[bytes]) -> tuple[str, str]:
    """SIGTERM, then its output (stdout, stderr)."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    return out.decode(), err.decode()


def _serve_with_tables(
    tmp_path: Path, event_server: ServerProcess
) -> tuple[int, subprocess.Popen[bytes]]:
    """An intermediary fed by ``event_server`` with :data:`TABLES` (row events ``db/...``),
    on a free port: the port and the process."""
    port = free_port()
    config = _config(
        tmp_path,
        listen=f"127.0.0.1:{port}",
        event_server=event_server.eventer,
        row_type_prefix=["db"],
        tables=TABLES,
    )
    return port, _serve(config)


def _assert_it_ends_with_exit_2(proc: subprocess.Popen[bytes], last_line: str) -> None:
    """It ends on its own (killed if not within a minute) with exit code 2, its last line of
    stderr starting with ``last_line``."""
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2
    assert err.decode().strip().splitlines()[-1].startswith(last_line), err.decode()


async def _next(subscriber: IntermediaryClient, op: str, key: str) -> dict[str, Any]:
    """The next message ``op`` of ``key`` (a view's ``unchanged`` messages skipped)."""
    while True:
        message = await subscriber.message(30)
        if message["op"] == op and message["key"] == key and "unchanged" not in message:
            return message


async def _subscribe_and_watch(url: str, eventer: str) -> tuple[dict[str, Any], ...]:
    async with await IntermediaryClient.connect(url) as subscriber:
        await subscriber.subscribe_events("ev", [["app", "*"]])
        await subscriber.subscribe_sql("v", "SELECT id, name FROM users WHERE city = 'Oslo'")
        first = await _next(subscriber, "view", "v")  # the table's load: empty
        with pytest.raises(IntermediaryError, match="no spatial state"):
            await subscriber.subscribe("map", {"box": [0, 0, 1, 1]})
        async with await client.connect(eventer) as producer:
            await producer.register_with_response(
                [
                    client.json_event(("app", "signup"), {"user": 1}),
                    client.json_event(("other", "x"), {"not": "seen"}),
                    client.json_event(
                        ("db", "rows.users"),
                        {"key": 1, "row": {"id": 1, "name": "ann", "city": "Oslo"}},
                    ),
                    client.json_event(
                        ("db", "rows.users"),
                        {"key": 2, "row": {"id": 2, "name": "bob", "city": "Rome"}},
                    ),
                ]
            )
        event = await _next(subscriber, "event", "ev")
        view = await _next(subscriber, "view", "v")
        return first, event, view


def test_a_subscriber_sees_events_and_a_view_and_sigterm_ends_it(
    tmp_path: Path, event_server: ServerProcess
) -> None:
    port, proc = _serve_with_tables(tmp_path, event_server)
    try:
        wait_for_port(port, 30, process=proc)
        first, event, view = run(
            _subscribe_and_watch(f"ws://127.0.0.1:{port}/", event_server.eventer)
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=10) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
    finally:
        out, err = _stop(proc)
    assert first["rows"] == []
    assert event["type"] == ["app", "signup"] and event["payload"] == {"user": 1}
    assert view["rows"] == [[1, "ann"]]
    assert proc.returncode == 0, err
    assert (
        f"intermediary listening on ws://127.0.0.1:{port}/ (page: http://127.0.0.1:{port}/live), "
        f"fed by the event server {event_server.eventer}"
    ) in out
    assert '"msg": "intermediary stopped"' in err and "Traceback" not in err


def test_an_unreachable_event_server_is_one_line_and_exit_2(tmp_path: Path) -> None:
    nowhere = local_address(free_port())
    proc = _serve(_config(tmp_path, listen=f"127.0.0.1:{free_port()}", event_server=nowhere))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: chain: cannot connect to {nowhere}: ")
    assert "intermediary listening" not in out.decode()


async def _ride_out(url: str, server: ServerProcess) -> list[dict[str, Any]]:
    """A subscriber of events and a view while ``server`` is SIGKILLed and started again,
    with events and row changes before, during the outage's end and after: every message
    it got, its connection never closed."""
    got: list[dict[str, Any]] = []

    async def until(subscriber: IntermediaryClient, last: Any) -> None:
        while not last(message := await subscriber.message(60)):
            got.append(message)
        got.append(message)

    def row(key: int, name: str, city: str) -> client.NewEvent:
        return client.json_event(
            ("db", "rows.users"), {"key": key, "row": {"id": key, "name": name, "city": city}}
        )

    async with await IntermediaryClient.connect(url) as subscriber:
        await subscriber.subscribe_events("ev", [["app", "*"]])
        await subscriber.subscribe_sql("v", "SELECT id, name FROM users ORDER BY id")
        async with await client.connect(server.eventer) as producer:
            await producer.register_with_response(
                [client.json_event(("app", "1"), 1), row(1, "ann", "Oslo"), row(2, "bob", "Rome")]
            )
        await until(subscriber, lambda m: m.get("rows") == [[1, "ann"], [2, "bob"]])
        server.kill()
        await until(subscriber, lambda m: m["op"] == "status")
        server.start()
        async with await client.connect(server.eventer) as producer:
            await producer.register_with_response(
                [client.json_event(("app", "2"), 2), row(1, "ann", "Bergen"), row(3, "cy", "Oslo")]
            )
            await until(subscriber, lambda m: m["op"] == "status")
            await producer.register_with_response(
                [client.json_event(("app", "3"), 3), row(2, "bo", "Rome")]
            )
        await until(subscriber, lambda m: m.get("rows") == [[1, "ann"], [2, "bo"], [3, "cy"]])
        assert subscriber.close_code is None and subscriber.stale == {}
    return got


@pytest.mark.slow
def test_a_killed_event_server_is_ridden_out_and_subscribers_converge(
    tmp_path: Path, event_server: ServerProcess
) -> None:
    """SIGKILL the event server under a served intermediary, then start it again: the
    subscriber keeps its connection and subscriptions, is told the upstream is stale and then
    fresh, gets every event once in order, and its view converges (row changes made while
    the intermediary was away included)."""
    port = free_port()
    config = _config(
        tmp_path,
        listen=f"127.0.0.1:{port}",
        event_server=[event_server.eventer],
        row_type_prefix=["db"],
        tables=TABLES,
    )
    proc = _serve(config)
    try:
        wait_for_port(port, 30, process=proc)
        got = run(_ride_out(f"ws://127.0.0.1:{port}/", event_server), 120)
    finally:
        _, err = _stop(proc)
    statuses = [m for m in got if m["op"] == "status"]
    assert [m["stale"] for m in statuses] == [True, False]
    assert all(m["upstream"] == "event_server" for m in statuses)
    events = [m["payload"] for m in got if m["op"] == "event"]
    assert events == [1, 2, 3]
    # Stale after what came before the kill; event 2 (registered as the server came back)
    # after it, caught up or live; fresh before what was registered after it.
    order = [
        ("event", m["payload"]) if m["op"] == "event" else ("stale", m["stale"])
        for m in got
        if m["op"] in ("event", "status")
    ]
    assert order.index(("event", 1)) < order.index(("stale", True)) < order.index(("event", 2))
    assert order[-2:] == [("stale", False), ("event", 3)]
    assert proc.returncode == 0, err
    assert "intermediary chain: resynchronised" in err


async def _move_to_peer(url: str, a: ServerProcess, b: ServerProcess) -> list[dict[str, Any]]:
    """Events registered on ``a`` (and synced to ``b``), ``a`` SIGKILLed, more registered on
    ``b`` meanwhile and after: what the subscriber got until the last one."""
    got: list[dict[str, Any]] = []

    async def until(subscriber: IntermediaryClient, last: Any) -> None:
        while not last(message := await subscriber.message(60)):
            got.append(message)
        got.append(message)

    async def register(server: ServerProcess, *payloads: int) -> None:
        async with await client.connect(server.eventer) as producer:
            await producer.register_with_response(
                [client.json_event(("app", str(p)), p) for p in payloads]
            )

    async with await IntermediaryClient.connect(url) as subscriber:
        await subscriber.subscribe_events("ev", [["app", "*"]])
        await register(a, 1, 2)
        await until(subscriber, lambda m: m.get("payload") == 2)
        await register(b, 3)  # synced to a, notified by both
        await until(subscriber, lambda m: m.get("payload") == 3)
        a.kill()
        await register(b, 4)
        await until(subscriber, lambda m: m["op"] == "status" and not m["stale"])
        await register(b, 5)
        await until(subscriber, lambda m: m.get("payload") == 5)
        assert subscriber.close_code is None
    return got


@pytest.mark.slow
def test_an_intermediary_moves_to_the_peer_of_a_killed_server_and_folds_nothing_twice(
    tmp_path: Path,
) -> None:
    """A redundant pair (Syncer): the intermediary follows ``[a, b]``; ``a`` is SIGKILLed and
    it moves to ``b``, which holds ``a``'s events with ``a``'s ids. The subscriber gets every
    event once, in order, those registered on ``b`` while it moved included."""
    ports = {name: {"eventer": free_port(), "syncer": free_port()} for name in "ab"}
    syncers = {name: local_address(port["syncer"]) for name, port in ports.items()}
    a = ServerProcess.tidings(tmp_path / "a", 1, ports["a"], [(2, syncers["b"])], "t0k3n")
    b = ServerProcess.tidings(tmp_path / "b", 2, ports["b"], [(1, syncers["a"])], "t0k3n")
    a.start()
    b.start()
    port = free_port()
    config = _config(tmp_path, listen=f"127.0.0.1:{port}", event_server=[a.eventer, b.eventer])
    proc = _serve(config)
    try:
        wait_for_port(port, 30, process=proc)
        got = run(_move_to_peer(f"ws://127.0.0.1:{port}/", a, b), 120)
    finally:
        _, err = _stop(proc)
        a.stop()
        b.stop()
    events = [m["payload"] for m in got if m["op"] == "event"]
    assert events == [1, 2, 3, 4, 5]
    assert [m["stale"] for m in got if m["op"] == "status"] == [True, False]
    assert f"resynchronised from {b.eventer}" in err


@pytest.mark.parametrize(
    ("section", "line"),
    [
        ({"listen": "8100"}, "intermediary.listen: expected HOST:PORT"),
        ({"event_server": "http://h:1"}, "intermediary.event_server: address"),
        (
            {"event_server": ["tcp+sbs://h:1", "tcp+sbs://h"]},
            "intermediary.event_server: address 'tcp+sbs://h': expected",
        ),
        ({"event_server": []}, "intermediary.event_server: give at least one"),
        (
            {"event_server": ["tcp+sbs://h:1", "tcp+sbs://h:1"]},
            "intermediary.event_server: tcp+sbs://h:1 is listed twice",
        ),
        (
            {"tables": {"users": {"columns": {"id": "integer"}, "keyed_by": "uid"}}},
            "intermediary.tables.users: keyed_by: 'uid' is not one of the columns",
        ),
        (
            {"tables": {"users": {"columns": {"id": "int"}, "keyed_by": "id"}}},
            "intermediary.tables.users.columns.id: Input should be 'integer'",
        ),
        ({"limits": {"max_queued_messages": 0}}, "intermediary.limits.max_queued_messages:"),
        ({"limits": {"max_queued_bytes": 1000}}, "intermediary.limits.max_queued_bytes:"),
        ({"limits": {"view_workers": 0}}, "intermediary.limits.view_workers:"),
        ({"tick": "soon"}, "intermediary.tick: not a duration: 'soon'"),
        ({"row_type_prefx": ["db"]}, "intermediary.row_type_prefx: unknown key"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_key(
    tmp_path: Path, section: dict[str, Any], line: str
) -> None:
    result = CliRunner().invoke(
        app, ["intermediary", "serve", "-c", str(_config(tmp_path, **section))]
    )
    assert result.exit_code == 2, result.output
    header, *errors = result.stderr.strip().splitlines()
    assert header == "error: invalid configuration:"
    assert len(errors) == 1 and errors[0].strip().startswith(line), errors


def test_config_check_and_schema_show_the_section(tmp_path: Path) -> None:
    config = _config(tmp_path, tables=TABLES)
    checked = yaml.safe_load(CliRunner().invoke(app, ["config", "check", "-c", str(config)]).stdout)
    assert checked["intermediary"]["listen"] == "127.0.0.1:8100"
    assert checked["intermediary"]["tables"]["users"]["keyed_by"] == "id"
    assert checked["intermediary"]["limits"]["max_queued_messages"] == 10_000
    assert checked["intermediary"]["limits"]["max_queued_bytes"] == 16 * 1024 * 1024
    schema = CliRunner().invoke(app, ["config", "schema"]).stdout
    assert '"IntermediaryConfig"' in schema and '"max_view_rows"' in schema


def test_the_example_is_valid() -> None:
    section = load_config_file(EXAMPLE).intermediary
    assert section.event_server == "tcp+sbs://127.0.0.1:23012"  # examples/server.yaml's
    assert catalog_of(section) is not None and section.row_type_prefix == ["db"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_it_with_exit_0(
    tmp_path: Path, event_server: ServerProcess, signum: signal.Signals
) -> None:
    port = free_port()
    proc = _serve(_config(tmp_path, listen=f"127.0.0.1:{port}", event_server=event_server.eventer))
    wait_for_port(port, 30, process=proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()


def test_an_address_in_use_is_one_line_and_exit_2(
    tmp_path: Path, event_server: ServerProcess
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = _config(tmp_path, listen=f"127.0.0.1:{port}", event_server=event_server.eventer)
        proc = _serve(config)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.decode().strip().splitlines() == [
        f"error: transport: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]


#: What the /live page shows, read from its DOM: per panel, its state line and its cells.
LIVE_DOM = """Array.from(document.querySelectorAll('section')).map((s) => ({
  title: s.querySelector('h2').textContent,
  state: s.querySelector('.state').textContent,
  cells: Array.from(s.querySelectorAll('li, tr')).map((r) => r.textContent),
}))"""


async def produce_paid_and_cy(eventer: str) -> None:
    """An ``app/paid`` event and the row of user 3, "cy" of Oslo, into the event server."""
    async with await client.connect(eventer) as producer:
        await producer.register_with_response(
            [
                client.json_event(("app", "paid"), {"order": 7}),
                client.json_event(
                    ("db", "rows.users"), {"key": 3, "row": {"id": 3, "name": "cy", "city": "Oslo"}}
                ),
            ]
        )


async def live_panels(page: Page, eventer: str) -> list[dict[str, Any]]:
    """Once the /live page of ``events=app/*``, a view of users and a refused view is live:
    :func:`produce_paid_and_cy`, then its panels once each shows it (:data:`LIVE_DOM`)."""
    await page.wait_for(
        "window.tidingsLive?.state === 'live' && window.tidingsLive.panels.sql1.rows !== null"
    )
    await produce_paid_and_cy(eventer)
    await page.wait_for(
        "window.tidingsLive.panels.events1.events.length === 1 && "
        "window.tidingsLive.panels.sql1.rows.length === 1 && "
        "window.tidingsLive.panels.sql2.error"
    )
    return await page.evaluate(LIVE_DOM)


async def _watch_the_page(url: str, eventer: str, profile: Path) -> list[dict[str, Any]]:
    browser = await Browser.start(profile)
    try:
        return await live_panels(await browser.open(url), eventer)
    finally:
        await browser.close()


def test_the_live_page_shows_events_and_a_view(tmp_path: Path, event_server: ServerProcess) -> None:
    """Headless Chromium on /live, against the process as an operator runs it."""
    port, proc = _serve_with_tables(tmp_path, event_server)
    query = urllib.parse.urlencode(
        [
            ("events", "app/*"),
            ("sql", "SELECT id, name FROM users"),
            ("sql", "SELECT secret FROM users"),
        ],
        quote_via=urllib.parse.quote,  # %20, as the browser's location.href has it
    )
    try:
        wait_for_port(port, 30, process=proc)
        panels = run(
            _watch_the_page(
                f"http://127.0.0.1:{port}/live?{query}", event_server.eventer, tmp_path / "profile"
            ),
            120,
        )
    finally:
        _stop(proc)
    events, view, refused = panels
    assert events["title"] == "events app/*" and events["cells"] == ['app/paid {"order":7}']
    assert view["cells"] == ["idname", "3cy"] and view["state"].startswith("1 rows at epoch")
    assert "secret" in refused["state"] and refused["cells"] == []


# -- a spatial upstream: tidings intermediary simulate ------------------------------------


def _simulate(port: int, *args: str) -> subprocess.Popen[bytes]:
    return tidings_cli(
        "intermediary", "simulate", "--agents", "3000", "--world", "200",
        "--listen", f"127.0.0.1:{port}", *args,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


SPHERE = {"sphere": {"center": [100, 100], "radius": 30}}


async def _watch_region(url: str) -> list[Any]:
    """Subscribe a region and take three view frames of it."""
    async with await IntermediaryClient.connect(url) as subscriber:
        reply = await subscriber.subscribe("near", SPHERE, rate_hz=20)
        assert reply["op"] == "subscribed", reply
        frames = []
        async for frame in subscriber.frames():
            if frame.ids.size:
                frames.append(frame)
            if len(frames) == 3:
                return frames
    raise AssertionError("the subscription ended")


def test_a_region_is_served_from_a_spatial_publisher_and_sigterm_ends_both(
    tmp_path: Path, event_server: ServerProcess
) -> None:
    feed_port, port = free_port(), free_port()
    publisher = _simulate(feed_port)
    try:
        wait_for_port(feed_port, 30, process=publisher)
        spatial = {"upstream": f"ws://127.0.0.1:{feed_port}/", "world_lo": [0, 0]}
        spatial["world_hi"] = [200, 200]
        config = _config(
            tmp_path, listen=f"127.0.0.1:{port}", event_server=event_server.eventer,
            spatial=spatial,
        )  # fmt: skip
        proc = _serve(config)
        try:
            wait_for_port(port, 30, process=proc)
            frames = run(_watch_region(f"ws://127.0.0.1:{port}/"))
        finally:
            out, err = _stop(proc)
    finally:
        feed_out, feed_err = _stop(publisher)
    for frame in frames:
        distance = np.linalg.norm(frame.world_positions() - np.array([100.0, 100.0]), axis=1)
        assert np.all(distance <= 30.0 + 1e-3)  # float32 frames
    assert proc.returncode == 0, err
    assert f"and the spatial publisher ws://127.0.0.1:{feed_port}/" in out
    assert publisher.returncode == 0, feed_err
    assert (
        "simulation of 3000 agents in a 2D world of side 200 at 10 Hz, serving the spatial "
        f"feed on ws://127.0.0.1:{feed_port}/"
    ) in feed_out


def test_a_spatial_publisher_not_there_at_start_is_one_line_and_exit_2(
    tmp_path: Path, event_server: ServerProcess
) -> None:
    feed_port, port = free_port(), free_port()
    spatial = {"upstream": f"ws://127.0.0.1:{feed_port}/", "world_lo": [0, 0]}
    spatial["world_hi"] = [200, 200]
    config = _config(
        tmp_path, listen=f"127.0.0.1:{port}", event_server=event_server.eventer, spatial=spatial
    )
    proc = _serve(config)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: feed: cannot connect to ws://127.0.0.1:{feed_port}/"
    ), lines


async def _region_across_restart(url: str, restart: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """A region's frames before the publisher goes, the status messages, and frames after
    it is back (``restart`` stops and starts it), on one connection."""
    async with await IntermediaryClient.connect(url) as subscriber:
        await subscriber.subscribe("near", SPHERE, rate_hz=20)
        before = await _frames(subscriber, 2)
        restart_task = asyncio.get_running_loop().run_in_executor(None, restart)
        statuses = [await subscriber.message(60), await subscriber.message(60)]
        await restart_task
        async for _ in subscriber.frames():  # frames sent before the fresh status
            break
        after = await _frames(subscriber, 3)
        assert subscriber.close_code is None
        return before, statuses, after


async def _frames(subscriber: IntermediaryClient, count: int) -> list[Any]:
    frames = []
    async for frame in subscriber.frames():
        if frame.ids.size:
            frames.append(frame)
        if len(frames) == count:
            return frames
    raise AssertionError("the subscription ended")


@pytest.mark.slow
def test_a_spatial_publisher_gone_and_back_is_ridden_out_with_its_new_state(
    tmp_path: Path, event_server: ServerProcess
) -> None:
    """The publisher (3000 agents) is stopped and another (1000 agents, ids below 1000)
    started on its port: the region's subscriber is told the spatial upstream is stale and
    then fresh, keeps its connection and subscription, and its frames then hold only the new
    publisher's agents (the old ones were deleted, not kept as ghosts)."""
    feed_port, port = free_port(), free_port()
    spatial = {"upstream": f"ws://127.0.0.1:{feed_port}/", "world_lo": [0, 0]}
    spatial["world_hi"] = [200, 200]
    config = _config(
        tmp_path, listen=f"127.0.0.1:{port}", event_server=event_server.eventer, spatial=spatial
    )
    publishers = [_simulate(feed_port)]

    def restart() -> None:
        _stop(publishers[0])
        publishers.append(_simulate(feed_port, "--agents", "1000", "--seed", "5"))
        wait_for_port(feed_port, 30, process=publishers[-1])

    try:
        wait_for_port(feed_port, 30, process=publishers[0])
        proc = _serve(config)
        try:
            wait_for_port(port, 30, process=proc)
            before, statuses, after = run(
                _region_across_restart(f"ws://127.0.0.1:{port}/", restart), 120
            )
        finally:
            _, err = _stop(proc)
    finally:
        for publisher in publishers:
            if publisher.poll() is None:
                _stop(publisher)
    assert max(int(f.ids.max()) for f in before) >= 1000  # the first publisher's agents
    assert [(m["op"], m["upstream"], m["stale"]) for m in statuses] == [
        ("status", "spatial", True),
        ("status", "spatial", False),
    ]
    assert all(int(f.ids.max()) < 1000 for f in after)
    assert proc.returncode == 0, err
    assert "feed: resynchronised" in err


@pytest.mark.parametrize(
    ("spatial", "line"),
    [
        (
            {"upstream": "http://h:1/", "world_lo": [0, 0], "world_hi": [1, 1]},
            "intermediary.spatial.upstream: expected a ws:// or wss:// URL",
        ),
        (
            {"upstream": "ws://h:1/", "world_lo": [0, 0], "world_hi": [1, 1, 1]},
            "intermediary.spatial: world_lo and world_hi must have the same",
        ),
        (
            {"upstream": "ws://h:1/", "world_lo": [0, 5], "world_hi": [1, 1]},
            "intermediary.spatial: axis 1 needs finite world_lo < world_hi",
        ),
        (
            {"upstream": "ws://h:1/", "world_lo": [0], "world_hi": [1, 1]},
            "intermediary.spatial.world_lo: List should have at least 2 items",
        ),
        (
            {"upstream": "ws://h:1/", "world_lo": [0, 0], "world_hi": [1, 1], "margin": -1},
            "intermediary.spatial.margin: Input should be greater than or equal to 0",
        ),
    ],
)
def test_a_bad_spatial_section_is_one_line_naming_its_key(
    tmp_path: Path, spatial: dict[str, Any], line: str
) -> None:
    config = _config(tmp_path, spatial=spatial)
    result = CliRunner().invoke(app, ["intermediary", "serve", "-c", str(config)])
    assert result.exit_code == 2, result.output
    header, *errors = result.stderr.strip().splitlines()
    assert header == "error: invalid configuration:"
    assert len(errors) == 1 and errors[0].strip().startswith(line), errors


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--listen", "8200"], "error: --listen: expected HOST:PORT"),
        (["--world", "nan"], "Invalid value for '--world'"),
        (["--dim", "4"], "Invalid value for '--dim'"),
    ],
)
def test_a_bad_simulate_option_is_one_line_and_exit_2(args: list[str], line: str) -> None:
    result = CliRunner().invoke(app, ["intermediary", "simulate", *args])
    assert result.exit_code == 2, result.output
    assert line in result.stderr, result.stderr
