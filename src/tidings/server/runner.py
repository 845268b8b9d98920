"""One running event server: backend, engine, Syncer server, Eventer server, Syncer clients.

A standalone server starts in hat-event 0.8.5's order, which its clients can observe in
the event log: the engine's STARTED event, then the Syncer server's first status event, then
the Eventer server opens (each client connection then registers its CONNECTED event), and
last the Syncer clients connect to the configured peers. Shutdown runs the other way round
and ends with the engine's STOPPED event, so a restarted server's log shows every stop it
had time to record. A server in a Monitor group starts its store and Syncer server, joins
the group, and registers STARTED and opens its Eventer server each time it is blessed
(STOPPED when the blessing goes), as hat-event's engine runner does.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tidings.config.server import ServerConfig
from tidings.errors import ConfigError, EngineError, StoreError
from tidings.server.async_engine import AsyncEngine
from tidings.server.backends import open_backend
from tidings.server.engine import Engine
from tidings.server.eventer.access import EventerAccess
from tidings.server.eventer.counters import EventerCounters
from tidings.server.eventer.server import EventerServer
from tidings.server.log_retention import LogRetention, syncer_holder
from tidings.server.metrics import MetricsEndpoint
from tidings.server.modules import load_modules
from tidings.server.monitor import MonitorLink
from tidings.server.store import EventStore
from tidings.server.syncer.client import SyncerClient
from tidings.server.syncer.server import SyncerServer
from tidings.tasks import stop_task

log = logging.getLogger(__name__)

#: The interpreter's GIL switch interval while a server runs (see serve).
_SWITCH_INTERVAL_S = 0.0005


#: Starts a part that runs on top of a started server (the streams); returns its stop.
Attachment = Callable[["RunningServer"], Awaitable[Callable[[], Awaitable[None]]]]


@dataclass
class RunningServer:
    """The parts of a started server; :meth:`aclose` stops them in reverse order.

    The *serving* parts (the engine's STARTED event, the Eventer server, the attachment) run
    from start to stop on a standalone server, and while the Monitor blesses the server on
    one configured with ``monitor`` (:mod:`tidings.server.monitor`); the rest (store,
    Syncer server and clients, metrics) runs from start to stop either way.
    """

    config: ServerConfig
    store: EventStore
    engine: AsyncEngine
    syncer: SyncerServer | None = None
    attach: Attachment | None = None
    #: The Eventer server while the server serves clients (None otherwise).
    eventer: EventerServer | None = None
    #: What the Eventer servers served, kept across blessings for the metrics.
    counters: EventerCounters = field(default_factory=EventerCounters)
    static_peers: list[SyncerClient] = field(default_factory=list)
    monitor: MonitorLink | None = None
    metrics: MetricsEndpoint | None = None
    #: The log's retention (``retention:``), whose passes run while the server serves.
    retention: LogRetention | None = None
    _detach: Callable[[], Awaitable[None]] | None = None
    _retention_task: asyncio.Task[None] | None = None
    _retention_pool: ThreadPoolExecutor | None = None

    @property
    def peers(self) -> list[SyncerClient]:
        """The Syncer clients of this moment (configured, or found through the Monitor)."""
        if self.monitor is not None:
            return list(self.monitor.peers.values())
        return list(self.static_peers)

    @classmethod
    async def start(cls, config: ServerConfig, attach: Attachment | None = None) -> RunningServer:
        """Start every part; if one fails, the parts already started are stopped again."""
        server_id = config.engine.server_id
        standalone = config.monitor is None
        async with contextlib.AsyncExitStack() as undo:
            store = open_backend(
                config.backend.module, config.backend.options(), server_id, config.base_dir
            )
            undo.callback(store.close)
            engine = Engine(store, [], max_session_events=config.engine.max_session_events)
            load_modules(engine, [module.as_dict() for module in config.engine.modules])
            undo.callback(engine.close)  # after the last session (STOPPED), before the store
            async_engine = AsyncEngine(engine, flush_period=config.backend.held_flush_period)
            undo.push_async_callback(async_engine.aclose)
            if standalone:
                await async_engine.write(engine.start)
            syncer = None
            if config.syncer_server is not None:
                syncer = await SyncerServer.start(
                    config.syncer_server.address,
                    async_engine,
                    tls=config.syncer_server.tls,
                    accept=config.syncer_server,
                )
                undo.push_async_callback(syncer.aclose)
            running = cls(config, store, async_engine, syncer, attach)
            if config.retention is not None:
                running.retention = LogRetention(store, config.retention)
                if syncer is not None:
                    horizon = config.retention.peer_horizon.total_seconds()
                    running.retention.hold("syncer peers", syncer_holder(store, syncer, horizon))
            # Before the serving parts: the attachment (the streams) adds its own metrics.
            if config.metrics is not None:
                running.metrics = MetricsEndpoint(
                    running, config.metrics.address, config.metrics.port
                )
                undo.callback(running.metrics.close)
            if standalone:
                await running._open_serving()
                undo.push_async_callback(running._close_serving)
                for peer in config.syncer_peers:
                    client = SyncerClient(
                        peer.address,
                        async_engine,
                        peer.server_id,
                        tls=config.syncer_client.tls,
                    )
                    await client.start()
                    undo.push_async_callback(client.aclose)
                    running.static_peers.append(client)
            if not standalone:
                running.monitor = await MonitorLink.start(config, async_engine, running._serve)
                undo.push_async_callback(running.monitor.aclose)
            undo.pop_all()  # all started: from now on aclose() stops them
        log.info(
            "event server %d started",
            server_id,
            extra={
                "server_id": server_id,
                "eventer": config.eventer_server.address,
                "syncer": None if config.syncer_server is None else config.syncer_server.address,
                "peers": [p.address for p in config.syncer_peers],
                "monitor": None if config.monitor is None else config.monitor.monitor_address,
            },
        )
        return running

    async def _open_serving(self) -> None:
        """Open the Eventer server and start the attachment (stopped again on failure)."""
        self.eventer = await EventerServer.start(
            self.config.eventer_server.address,
            self.engine,
            max_frame_bytes=self.config.eventer_server.max_frame_bytes,
            max_subscriber_lag_bytes=self.config.eventer_server.max_subscriber_lag_bytes,
            counters=self.counters,
            tls=self.config.eventer_server.tls,
            accept=self.config.eventer_server,
            access=EventerAccess(
                self.config.eventer_server.anonymous, self.config.eventer_server.identities
            ),
            on_table_load=None if self.retention is None else self.retention.table_loaded,
        )
        if self.attach is not None:
            try:
                self._detach = await self.attach(self)
            except BaseException:
                await self._close_serving()
                raise
        if self.retention is not None:  # after the attachment: the streams hold their needs
            self._retention_pool = ThreadPoolExecutor(1, thread_name_prefix="tidings-retention")
            self._retention_task = asyncio.create_task(self.retention.run(self._retention_pool))

    async def _close_serving(self) -> None:
        """Stop the log's retention, the attachment, then the Eventer server (its clients'
        DISCONNECTED events)."""
        if self._retention_task is not None and self.retention is not None:
            task, self._retention_task = self._retention_task, None
            self.retention.interrupt()
            await stop_task(task)
        if self._retention_pool is not None:  # a pass under way ends after its chunk
            pool, self._retention_pool = self._retention_pool, None
            await asyncio.to_thread(pool.shutdown, True)
        try:
            if self._detach is not None:
                detach, self._detach = self._detach, None
                await detach()
        finally:
            if self.eventer is not None:
                eventer, self.eventer = self.eventer, None
                await eventer.aclose()

    async def _serve(self) -> None:
        """The blessed part of a server in a Monitor group: STARTED, serve until cancelled
        (the blessing went, or the server stops), then stop serving and register STOPPED."""
        await self.engine.write(self.engine.engine.start)
        try:
            await self._open_serving()
            await asyncio.Future()
        finally:
            await _uncancellable(self._stop_serving())

    async def _stop_serving(self) -> None:
        try:
            await self._close_serving()
        finally:
            await self.engine.write(self.engine.engine.stop)
            await self._flush_held()  # the server blessed next gets them from the Syncer

    async def _flush_held(self) -> None:
        """Commit held registrations now, so the Syncer peers get them (periodic
        durability); a store that lost them has nothing to commit."""
        if self.store.failed is None:
            await self.engine.flush()

    async def aclose(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.monitor is not None:
            await self.monitor.aclose()  # stops serving first if it was blessed
        for client in self.static_peers:
            await client.aclose()
        await self._close_serving()
        try:
            if self.syncer is not None:
                await self._flush_held()  # before the Syncer's last round with its peers
                await self.syncer.aclose()
            if self.monitor is None:
                await self.engine.write(self.engine.engine.stop)
        finally:
            try:
                await self.engine.aclose()
            finally:
                try:
                    self.engine.engine.close()
                finally:
                    self.store.close()
        log.info("event server %d stopped", self.config.engine.server_id)


async def _uncancellable(work: Awaitable[None]) -> None:
    """Run ``work`` to its end even if the caller is cancelled meanwhile (then re-raised)."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


def apply_logging(config: ServerConfig) -> None:
    """Use the configuration's ``log`` mapping if it has one (hat-event's dictConfig)."""
    if config.log is None:
        return
    try:
        logging.config.dictConfig(config.log)
    except (ValueError, TypeError, AttributeError, ImportError) as exc:
        raise ConfigError(f"log: not a valid logging configuration: {exc}") from exc


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
    running = await RunningServer.start(config, attach)
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
        await _until_stopped_or_failed(stop, running)
    finally:
        await running.aclose()


async def _until_stopped_or_failed(stop: asyncio.Event, running: RunningServer) -> None:
    """Wait for ``stop``; if the server cannot go on first (its Monitor link ended, its store
    lost held registrations), raise why: the server stops, with exit code 2 from the CLI."""
    broken = asyncio.ensure_future(running.engine.wait_broken())
    lost = None if running.monitor is None else asyncio.ensure_future(running.monitor.wait_lost())
    waits = [asyncio.ensure_future(stop.wait()), broken, *([lost] if lost is not None else [])]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    if stop.is_set():
        return
    if broken.done() and not broken.cancelled():
        if running.engine.engine.fault is not None:
            raise EngineError(f"{running.engine.engine.fault}; the server stops")
        raise StoreError(f"event store: {broken.result()}; the server stops")
    if lost is not None and lost.done() and not lost.cancelled():
        raise lost.result()
