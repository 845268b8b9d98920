"""One running event server: backend, engine, Syncer server, Eventer server, Syncer clients.

Start-up follows hat-event 0.8.5's order, which its clients can observe in the event log:
the engine's STARTED event, then the Syncer server's first status event, then the Eventer
server opens (each client connection then registers its CONNECTED event), and last the
Syncer clients connect to the configured peers. Shutdown runs the other way round and ends
with the engine's STOPPED event, so a restarted server's log shows every stop it had time
to record.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import logging.config
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tidings.errors import ConfigError
from tidings.server.async_engine import AsyncEngine
from tidings.server.backends import open_backend
from tidings.server.config import ServerConfig
from tidings.server.engine import Engine
from tidings.server.eventer import EventerServer
from tidings.server.metrics import MetricsEndpoint
from tidings.server.store import EventStore
from tidings.server.syncer.client import SyncerClient
from tidings.server.syncer.server import SyncerServer

log = logging.getLogger(__name__)

#: The interpreter's GIL switch interval while a server runs (see serve).
_SWITCH_INTERVAL_S = 0.0005


@dataclass
class RunningServer:
    """The parts of a started server; :meth:`aclose` stops them in reverse order."""

    config: ServerConfig
    store: EventStore
    engine: AsyncEngine
    eventer: EventerServer
    syncer: SyncerServer | None = None
    peers: list[SyncerClient] = field(default_factory=list)
    metrics: MetricsEndpoint | None = None

    @classmethod
    async def start(cls, config: ServerConfig) -> RunningServer:
        """Start every part; if one fails, the parts already started are stopped again."""
        server_id = config.engine.server_id
        async with contextlib.AsyncExitStack() as undo:
            store = open_backend(
                config.backend.module, config.backend.options(), server_id, config.base_dir
            )
            undo.callback(store.close)
            engine = Engine(store, [], max_session_events=config.engine.max_session_events)
            engine.load_modules([module.as_dict() for module in config.engine.modules])
            async_engine = AsyncEngine(engine)
            undo.push_async_callback(async_engine.aclose)
            await async_engine.write(engine.start)
            syncer = None
            if config.syncer_server is not None:
                syncer = await SyncerServer.start(config.syncer_server.address, async_engine)
                undo.push_async_callback(syncer.aclose)
            eventer = await EventerServer.start(
                config.eventer_server.address,
                async_engine,
                max_frame_bytes=config.eventer_server.max_frame_bytes,
                max_subscriber_lag_bytes=config.eventer_server.max_subscriber_lag_bytes,
            )
            undo.push_async_callback(eventer.aclose)
            running = cls(config, store, async_engine, eventer, syncer)
            for peer in config.syncer_peers:
                client = SyncerClient(peer.address, async_engine, peer.server_id)
                await client.start()
                undo.push_async_callback(client.aclose)
                running.peers.append(client)
            if config.metrics is not None:
                running.metrics = MetricsEndpoint(
                    running, config.metrics.address, config.metrics.port
                )
                undo.callback(running.metrics.close)
            undo.pop_all()  # all started: from now on aclose() stops them
        log.info(
            "event server %d started",
            server_id,
            extra={
                "server_id": server_id,
                "eventer": config.eventer_server.address,
                "syncer": None if syncer is None else config.syncer_server.address,
                "peers": [p.address for p in config.syncer_peers],
            },
        )
        return running

    async def aclose(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        for client in self.peers:
            await client.aclose()
        await self.eventer.aclose()
        if self.syncer is not None:
            await self.syncer.aclose()
        try:
            await self.engine.write(self.engine.engine.stop)
        finally:
            await self.engine.aclose()
            self.store.close()
        log.info("event server %d stopped", self.config.engine.server_id)


def apply_logging(config: ServerConfig) -> None:
    """Use the configuration's ``log`` mapping if it has one (hat-event's dictConfig)."""
    if config.log is None:
        return
    try:
        logging.config.dictConfig(config.log)
    except (ValueError, TypeError, AttributeError, ImportError) as exc:
        raise ConfigError(f"log: not a valid logging configuration: {exc}") from exc


#: Starts a part that runs on top of a started server (the streams); returns its stop.
Attachment = Callable[[RunningServer], Awaitable[Callable[[], Awaitable[None]]]]


async def serve(
    config: ServerConfig, stop: asyncio.Event | None = None, attach: Attachment | None = None
) -> None:
    """Run a server until ``stop`` is set or the process gets SIGINT/SIGTERM.

    ``attach`` starts what a layer above runs in the same process once the server is up
    (``tidings server`` attaches the FTN18 streams); it is stopped first.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    running = await RunningServer.start(config)
    try:
        detach = await attach(running) if attach is not None else None
    except BaseException:
        await running.aclose()
        raise
    # Everything start-up created lives as long as the server: out of the collector's sight,
    # a full collection (which the reply threads' garbage triggers every second or so)
    # no longer walks it while holding the GIL: it cost every client ~50 ms each time.
    gc.freeze()
    # A thread encoding a big reply holds the GIL until asked to drop it; the event loop,
    # which needs it for each step of every other client's round trip, asks after the
    # switch interval. 0.5 ms instead of 5 ms: the bystander's worst round trip during an
    # unbounded query was 13-26 ms in 7 runs, 19-54 ms in 3 runs without (2026-11-23).
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    try:
        await stop.wait()
    finally:
        try:
            if detach is not None:
                await detach()
        finally:
            await running.aclose()
