"""tidings' own stream consumer (tidings.streams.client, tidings consume), and the guarantee
that no event is skipped or reordered while several writers append to the store at once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading

import pytest

from bench.harness.processes import free_port
from tests.support.stream_helpers import PASSWORD, USER, add_events, serving, stream_server_config
from tests.support.waiting import run, until
from tidings.errors import StreamError
from tidings.events.model import NewEvent, PayloadKind
from tidings.server.store import EventStore
from tidings.streams.client import StreamClient, StreamEvent, consume

pytestmark = pytest.mark.sockets


async def _consume(
    url: str | list[str], component: str, count: int, **options
) -> list[StreamEvent]:
    """Run :func:`consume` until ``count`` events were handled."""
    got: list[StreamEvent] = []

    async def handler(event: StreamEvent) -> None:
        got.append(event)

    task = asyncio.create_task(consume(url, USER, PASSWORD, component, handler, **options))
    try:
        await until(lambda: len(got) >= count or task.done(), 20)
        if task.done():
            task.result()
    finally:
        task.cancel()
    return got


@pytest.mark.parametrize("push", [True, False], ids=["push", "poll"])
def test_python_consumer_resumes_where_it_acknowledged(tmp_path, push: bool) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            ids = await add_events(server.url, 30)
            first = await _consume(server.url, "PY", 30, push=push)
            assert [e.id for e in first] == ids
            await asyncio.sleep(0.3)  # the last acknowledgement goes out
            more = await add_events(server.url, 5)
            second = await _consume(server.url, "PY", 5, push=push)
            assert [e.id for e in second][:5] == more

    run(scenario(), timeout=60)


def test_python_client_calls_and_errors(tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            async with StreamClient(server.url, USER, PASSWORD) as client:
                first = await client.add_event("ORDER", {"n": 1})
                await client.register("C")
                [event] = await client.poll("C")
                assert (event.id, event.type, event.data) == (first, "ORDER", {"n": 1})
                assert await client.poll("C", first) == []
                with pytest.raises(StreamError) as caught:
                    await client.poll("UNKNOWN")
                assert caught.value.name == "NotRegistered"
            async with StreamClient(server.ws_url, USER, "wrong") as client:
                with pytest.raises(StreamError) as caught:
                    await client.register("C")
                assert caught.value.name == "SecurityError"
            with pytest.raises(StreamError, match="not a stream URL"):
                StreamClient("ftp://x/", USER, PASSWORD)

    run(scenario(), timeout=60)


async def _start_consume_cli(
    url: str, component: str, *flags: str, password: str = PASSWORD
) -> asyncio.subprocess.Process:
    """Start ``tidings consume`` with the stream user in its environment."""
    env = os.environ | {"TIDINGS_STREAM_USER": USER, "TIDINGS_STREAM_PASSWORD": password}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tidings.cli",
        "consume",
        url,
        component,
        *flags,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


async def _consume_cli(url: str, component: str, *flags: str, password: str = PASSWORD):
    """Run ``tidings consume`` to its end; its return code, stdout and stderr."""
    process = await _start_consume_cli(url, component, *flags, password=password)
    out, err = await asyncio.wait_for(process.communicate(), 30)
    return process.returncode, out, err


def test_consume_cli_prints_json_lines(tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            ids = await add_events(server.url, 3)
            for component, extra in (("CLIPUSH", []), ("CLIPOLL", ["--poll"])):
                code, out, err = await _consume_cli(server.url, component, "--count", "3", *extra)
                assert code == 0, err
                lines = [line for line in out.decode().splitlines() if line]
                assert [int(json.loads(line)["id"]) for line in lines] == ids
            code, _, err = await _consume_cli(server.url, "CLI", "--poll", password="wrong")
            assert code == 2 and b"SecurityError" in err

    run(scenario(), timeout=90)


def test_no_event_is_skipped_or_reordered_while_several_writers_commit(database_url: str) -> None:
    """Events appended by other store instances (a relay, a second server) while a reliable
    consumer reads: every one arrives, once, in id order. FutoIn's own server reads without
    ORDER BY and follows the highest id seen, and loses events here."""
    config = stream_server_config(database_url, secure_channel=True)
    writers, per_writer = 4, 150

    def write(index: int) -> None:
        store = EventStore(database_url, server_id=10 + index)
        try:
            for n in range(per_writer):
                payload = f'{{"w":{index},"n":{n}}}'.encode()
                store.register([NewEvent(("orders", "created"), payload, PayloadKind.JSON)])
        finally:
            store.close()

    async def scenario() -> None:
        async with serving(config) as server:
            threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
            got_push: list[StreamEvent] = []
            got_poll: list[StreamEvent] = []

            async def into(target: list[StreamEvent]):
                async def handler(event: StreamEvent) -> None:
                    target.append(event)

                return handler

            tasks = [
                asyncio.create_task(
                    consume(server.url, USER, PASSWORD, "PUSH", await into(got_push))
                ),
                asyncio.create_task(
                    consume(server.url, USER, PASSWORD, "POLL", await into(got_poll), push=False)
                ),
            ]
            for thread in threads:
                thread.start()
            while any(t.is_alive() for t in threads):
                await asyncio.sleep(0.05)
            total = writers * per_writer
            try:
                await until(lambda: len(got_push) >= total and len(got_poll) >= total, 30)
            finally:
                for task in tasks:
                    task.cancel()
            for got in (got_push, got_poll):
                ids = [event.id for event in got]
                assert ids == sorted(set(ids)) and len(ids) == total
                per = {}
                for event in got:
                    per.setdefault(event.data["w"], []).append(event.data["n"])
                assert all(ns == list(range(per_writer)) for ns in per.values())

    run(scenario(), timeout=120)


@pytest.mark.parametrize("push", [True, False], ids=["push", "poll"])
def test_python_consumer_reconnects_across_a_server_restart(tmp_path, push: bool) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        got: list[StreamEvent] = []

        async def handler(event: StreamEvent) -> None:
            got.append(event)

        async with serving(config) as server:
            url = server.url
            before = await add_events(url, 10)
            task = asyncio.create_task(
                consume(url, USER, PASSWORD, "RECON", handler, push=push, max_delay=0.1)
            )
            await until(lambda: len(got) >= 10, 20)
            await asyncio.sleep(0.3)  # the acknowledgement goes out
        async with serving(config):  # the same port, after a restart
            after = await add_events(url, 10)
            try:
                await until(lambda: len(got) >= 20, 30)
            finally:
                task.cancel()
        assert [e.id for e in got] == before + after

    run(scenario(), timeout=90)


@pytest.mark.parametrize("mode", [[], ["--poll"]], ids=["push", "poll"])
def test_consume_cli_says_once_when_the_stream_is_lost_and_once_when_it_is_back(
    tmp_path, mode: list[str]
) -> None:
    """A stream once reached is retried for ever (its server may be restarting), but not in
    silence: one warning when lost, however many tries fail, and one when it is back."""
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            url = server.url
            before = await add_events(url, 2)
            process = await _start_consume_cli(url, "LOST", "--count", "4", *mode)
            assert process.stdout is not None
            first = [await asyncio.wait_for(process.stdout.readline(), 20) for _ in before]
            await asyncio.sleep(0.3)  # the acknowledgement goes out (a poll sends it next)
        await asyncio.sleep(2)  # down long enough for several tries (0.1 s, 0.2 s, …) to fail
        async with serving(config):  # the same port, after a restart
            after = await add_events(url, 2)
            out, err = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0, err
        lines = [*first, *out.splitlines()]
        assert [int(json.loads(line)["id"]) for line in lines if line.strip()] == before + after
        said = [json.loads(line) for line in err.decode().splitlines()]
        assert [(record["level"], record["msg"]) for record in said] == [
            ("warning", "stream connection lost; reconnecting until it is back"),
            ("warning", "stream reached again"),
        ]
        assert all(record["url"] == url for record in said)

    run(scenario(), timeout=90)


def test_consume_cli_live_prints_new_events(tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            old = await add_events(server.url, 3)  # before: a live consumer does not get them
            process = await _start_consume_cli(
                server.url, "X", "--live", "--want", "PAY", "--count", "2"
            )
            added: list[int] = []
            communicate = asyncio.ensure_future(process.communicate())
            while not communicate.done():
                await add_events(server.url, 1, "ORDER")  # not wanted
                added += await add_events(server.url, 1, "PAY")
                await asyncio.wait({communicate}, timeout=0.2)
                assert len(added) < 100, "the live consumer printed nothing"
            out, err = communicate.result()
            assert process.returncode == 0, err
            ids = [int(json.loads(line)["id"]) for line in out.decode().splitlines() if line]
            assert len(ids) == 2 and set(ids) <= set(added) and ids == sorted(ids)
            assert not set(ids) & set(old)

    run(scenario(), timeout=90)


@pytest.mark.parametrize("push", [True, False], ids=["push", "poll"])
def test_python_consumer_moves_past_a_dead_url_to_the_next(tmp_path, push: bool) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)
    dead = f"http://127.0.0.1:{free_port()}/evt"  # nobody listens there

    async def scenario() -> None:
        async with serving(config) as server:
            ids = await add_events(server.url, 10)
            got = await _consume([dead, server.url], "MOVER", 10, push=push, connect_timeout=10)
            assert [e.id for e in got] == ids

    run(scenario(), timeout=60)


def test_consume_refuses_an_empty_url_list() -> None:
    async def handler(event: StreamEvent) -> None:
        raise AssertionError("never called")

    with pytest.raises(StreamError, match="no stream URL given"):
        run(consume([], USER, PASSWORD, "C", handler))
