"""``tidings demo``: the whole chain on a laptop, on the embedded default, with its verdict.

The bank commits operations (some rolled back) into its SQLite outbox; the Spark relay
(local mode) delivers them to the event server ``main`` through its ``event_server`` target;
the server's module raises alerts on large withdrawals; the server serves the bank's events
as an FTN18 stream to two reliable consumers (pushed, polling) and a live one; the
intermediary ``live`` follows the server and serves an event view and a SQL view of the
``account`` table to three subscribers. Then the verdict (:mod:`.verdict`) is judged from
the stores and the bank's own tables.

Everything runs from this one process and its Spark workers: the server, the streams and
the intermediary on one event loop in a thread, the relay's query in Spark, so nothing has
to be started by hand. The deployment is also written to ``tidings.yaml`` in the demo's
directory: ``tidings run`` runs the same chain as separate processes.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from tidings.db import make_engine
from tidings.demo.bank import Bank, BankRun
from tidings.demo.core import STAGE_TIMEOUT_S, running_relay, wait_until_delivered
from tidings.demo.deployment import STREAM_USER, Deployment, write_deployment
from tidings.demo.verdict import Verdict, account_rows, committed_events, judge, judge_consumer
from tidings.demo.watchers import VIEW_SUBSCRIBERS, Readers
from tidings.outbox.producer import Outbox
from tidings.targets.loop_thread import LoopThread


@dataclass
class ChainResult:
    verdict: Verdict
    bank: BankRun
    seconds: float
    deployment: Deployment


class _Parts:
    """The event server (with its streams and module) and the intermediary, on the loop."""

    def __init__(self, deployment: Deployment) -> None:
        self._deployment = deployment
        self._stop = asyncio.Event()
        self._intermediary: asyncio.Task[None] | None = None
        self._close_server: Callable[[], Coroutine[Any, Any, None]] | None = None

    async def start(self) -> None:
        from tidings.intermediary.serving.service import serve_intermediary
        from tidings.server.runner import RunningServer
        from tidings.streams.service.runner import streams_attachment

        config = self._deployment.config
        server_config = config.servers["main"]
        server = await RunningServer.start(server_config, streams_attachment(server_config))
        self._close_server = server.aclose
        listening = asyncio.get_running_loop().create_future()
        self._intermediary = asyncio.create_task(
            serve_intermediary(
                config.intermediaries["live"], self._stop, lambda where: listening.set_result(1)
            )
        )
        done, _ = await asyncio.wait(
            [listening, self._intermediary], return_when=asyncio.FIRST_COMPLETED
        )
        if self._intermediary in done:
            self._intermediary.result()  # raises why it could not start

    async def stop(self) -> None:
        self._stop.set()
        if self._intermediary is not None:
            await self._intermediary
        if self._close_server is not None:
            await self._close_server()


def run_chain_demo(
    workdir: Path,
    operations: int = 3000,
    rate: float = 500.0,
    say: Callable[[str], None] = print,
) -> ChainResult:
    """Run the whole-chain demo in ``workdir`` (wiped first) and return its verdict."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    deployment = write_deployment(workdir)
    config = deployment.config
    engine = make_engine(config.database.url)
    outbox = Outbox(engine, config.outbox)
    bank = Bank(engine, outbox, rows=True, rollback_share=0.05)
    loop = LoopThread("demo")
    parts = _Parts(deployment)
    readers = Readers(
        deployment.stream_url, STREAM_USER, deployment.stream_password, deployment.intermediary_url
    )
    say(f"deployment written to {deployment.path}")
    say("starting the event server (streams, module) and the intermediary ...")
    loop.run(parts.start(), STAGE_TIMEOUT_S)
    try:
        loop.run(readers.start(), STAGE_TIMEOUT_S)
        with running_relay(config, engine, outbox, say):
            started = time.monotonic()
            say(f"the bank performs {operations} operations at ~{rate:.0f}/s ...")
            done = bank.run(operations, rate)
            say("waiting for the relay, the consumers and the subscribers ...")
            wait_until_delivered(engine, STAGE_TIMEOUT_S)
            loop.run(_settled(readers, engine), STAGE_TIMEOUT_S + 10)
            seconds = time.monotonic() - started
            failures = readers.failures()
    finally:
        loop.run(readers.stop(), STAGE_TIMEOUT_S)
        loop.run(parts.stop(), STAGE_TIMEOUT_S)
        loop.stop()
    store = config.servers["main"].resolve(str(config.servers["main"].backend.options()["db_path"]))
    verdict = judge(
        engine,
        f"sqlite:///{store}",
        readers.consumers,
        readers.live,
        readers.subscribers,
        done.rolled_back,
        failures,
    )
    return ChainResult(verdict, done, seconds, deployment)


async def _settled(readers: Readers, engine: Engine) -> None:
    """Until every reliable consumer has every committed event and every SQL view equals
    the account table, or STAGE_TIMEOUT_S has passed (the verdict then says what is not)."""
    committed = await asyncio.to_thread(committed_events, engine)
    deadline = time.monotonic() + STAGE_TIMEOUT_S
    while time.monotonic() < deadline:
        accounts = await asyncio.to_thread(account_rows, engine)
        consumers = [judge_consumer(log, committed) for log in readers.consumers]
        views = readers.subscribers.views
        if (
            all(c.missing == 0 for c in consumers)
            and len(views) == VIEW_SUBSCRIBERS
            and all(rows == accounts for rows in views.values())
        ):
            return
        await asyncio.sleep(0.1)
