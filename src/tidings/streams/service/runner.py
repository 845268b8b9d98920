"""The streams of a running event server: their services and HTTP servers.

Started after the event server's own parts (``tidings server`` does it when the
configuration has ``streams:``), on the same event loop and engine: ``addEvent`` is a session
of that engine, and the feeds follow its listener. Streams sharing a host and port share one
HTTP server (uvicorn, on sockets bound here so that a port in use is an error at start-up),
each under its own path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import uvicorn

from tidings.config.streams import StreamConfig, StreamServerConfig
from tidings.errors import ConfigError
from tidings.server.runner import Attachment, RunningServer
from tidings.serving import QuietServer, listen, serve_guarded
from tidings.streams.consumers.compaction import run_compaction
from tidings.streams.consumers.metrics import MeasuredStream, StreamsCollector
from tidings.streams.consumers.positions import Consumers
from tidings.streams.consumers.retention import consumer_needs, run_retention
from tidings.streams.consumers.sync import ConsumerSync
from tidings.streams.service.access import StreamAccess
from tidings.streams.service.app import build_app
from tidings.streams.service.auth import Users
from tidings.streams.service.feed import StreamFeed
from tidings.streams.service.functions import StreamService
from tidings.streams.service.reader import StreamReader
from tidings.streams.service.refusals import SLOW_REQUEST_HEAD, Refusals
from tidings.streams.service.slow_clients import REQUEST_HEAD_TIMEOUT_S, protocol_class
from tidings.streams.typemap import TypeMap, type_map_from_config
from tidings.tasks import stop_task

log = logging.getLogger(__name__)

#: Threads for the streams' blocking work (store reads, consumer positions, password checks).
_WORKERS = 4


@dataclass
class RunningStreams:
    """The started streams; :meth:`aclose` stops them."""

    services: dict[str, StreamService]
    servers: list[tuple[QuietServer, asyncio.Task[None]]] = field(default_factory=list)
    executor: ThreadPoolExecutor | None = None
    password_checks: ThreadPoolExecutor | None = None
    unsubscribe: list[object] = field(default_factory=list)
    retention: asyncio.Task[None] | None = None
    compaction: asyncio.Task[None] | None = None
    sync: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, config: StreamServerConfig, server: RunningServer, users: Users
    ) -> RunningStreams:
        executor = ThreadPoolExecutor(_WORKERS, thread_name_prefix="tidings-streams")
        checks = ThreadPoolExecutor(1, thread_name_prefix="tidings-passwords")
        loop = asyncio.get_running_loop()
        running = cls({}, executor=executor, password_checks=checks)
        try:
            type_maps = {
                stream.name: type_map_from_config(stream.types) for stream in config.streams
            }
            carried = {name: type_map.carries for name, type_map in type_maps.items()}
            consumers = await loop.run_in_executor(executor, Consumers, server.store, carried)
            if server.retention is not None:
                streams = list(config.streams)
                release = server.retention.hold(
                    "stream consumers", lambda: consumer_needs(consumers, streams)
                )
                running.unsubscribe.append(release)
            # The peers' consumer events: listened to before the first catch-up reads.
            sync = ConsumerSync(server.store, consumers, executor)
            running.unsubscribe.append(server.engine.subscribe(sync.notice))
            running.sync = loop.create_task(sync.run())
            by_address: dict[tuple[str, int], list[StreamConfig]] = {}
            for stream in config.streams:
                by_address.setdefault((stream.host, stream.port), []).append(stream)
                running.services[stream.name] = _service(
                    stream,
                    type_maps[stream.name],
                    config,
                    server,
                    consumers,
                    users,
                    executor,
                    running,
                )
            running._measure(config, server)
            for (host, port), streams in by_address.items():
                services = {s.path: running.services[s.name] for s in streams}
                # A connection closed before its path is known counts under the port's first
                # stream.
                refusals = running.services[streams[0].name].refusals
                app = build_app(services)
                running.servers.append(await _serve(host, port, streams, app, refusals))
                log.info(
                    "streams serving",
                    extra={"address": f"{host}:{port}", "streams": [s.name for s in streams]},
                )
            running.compaction = loop.create_task(
                run_compaction(
                    server.store,
                    consumers,
                    config.stream_consumer_events.compact_every.total_seconds(),
                    executor,
                )
            )
            if any(s.retention.enabled for s in config.streams):
                running.retention = loop.create_task(
                    run_retention(server.store, consumers, config.streams, executor)
                )
        except BaseException:
            await running.aclose()
            raise
        return running

    def _measure(self, config: StreamServerConfig, server: RunningServer) -> None:
        """Add the streams with ``metrics: true`` to the server's metrics endpoint (the
        configuration has one when a stream asks for metrics)."""
        services = self.services
        measured = [
            MeasuredStream(s, services[s.name].push_sessions, services[s.name].refusal_counts)
            for s in config.streams
            if s.metrics
        ]
        if not measured:
            return
        assert server.metrics is not None, "checked by StreamServerConfig"
        registry, collector = server.metrics.registry, StreamsCollector(server.store, measured)
        registry.register(collector)
        self.unsubscribe.append(lambda: registry.unregister(collector))

    async def aclose(self) -> None:
        """Stop accepting and close every connection first (a consumer reconnecting must
        find the port closed, not a server on its way out), then the rest."""
        for server, _ in self.servers:
            server.should_exit = True
        for _, task in self.servers:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(10):
                    await task
        for service in self.services.values():
            await service.aclose()
        for background in (self.retention, self.compaction, self.sync):
            if background is not None:
                await stop_task(background)
        for remove in self.unsubscribe:
            remove()  # type: ignore[operator]
        for pool in (self.executor, self.password_checks):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)


def streams_attachment(config: StreamServerConfig) -> Attachment | None:
    """What :func:`tidings.server.runner.serve` attaches to run ``config``'s streams.

    The users' password hashes are read here, before the server starts, so that a missing
    environment variable stops ``tidings server`` before it opens anything.
    """
    if not config.streams:
        return None
    users = Users({name: user.resolved_hash(name) for name, user in config.stream_users.items()})
    unrestricted = config.unrestricted_users()
    if unrestricted:
        log.warning(
            "stream users without an allow list may use every stream, as any component, "
            "read every type and call addEvent (give them allow lists, see the security page)",
            extra={"users": unrestricted},
        )

    async def attach(server: RunningServer) -> Callable[[], Awaitable[None]]:
        return (await RunningStreams.start(config, server, users)).aclose

    return attach


def _service(
    stream: StreamConfig,
    type_map: TypeMap,
    config: StreamServerConfig,
    server: RunningServer,
    consumers: Consumers,
    users: Users,
    executor: ThreadPoolExecutor,
    running: RunningStreams,
) -> StreamService:
    """A stream's service, its feed following the engine from the store's last position.

    The position is read and the listener added in one step on the loop, so no batch falls
    between them.
    """
    feed = StreamFeed(type_map, server.store.last_position())
    running.unsubscribe.append(server.engine.subscribe(feed.add))
    reader = StreamReader(server.store, feed, type_map, executor)
    access = StreamAccess(
        stream.name, type_map, {name: user.allow for name, user in config.stream_users.items()}
    )
    assert running.password_checks is not None
    return StreamService(
        stream,
        type_map,
        server.engine,
        reader,
        consumers,
        users,
        access,
        executor,
        running.password_checks,
    )


async def _serve(
    host: str, port: int, streams: list[StreamConfig], app: object, refusals: Refusals
) -> tuple[QuietServer, asyncio.Task[None]]:
    """Start uvicorn for ``app`` on ``host:port``; return once it accepts connections. A
    connection that sends no whole request head in time is closed and counted in
    ``refusals`` (:mod:`.slow_clients`), as are those refused at accept (too many from
    one address, silent on a TLS port: :mod:`tidings.accept`)."""
    tls = {s.tls_certfile for s in streams}
    if len(tls) > 1:
        raise ConfigError(f"streams on {host}:{port} must all use the same TLS certificate")
    first = streams[0]
    try:
        sock = listen(host, port)
    except OSError as exc:
        raise ConfigError(f"streams: cannot listen on {host}:{port}: {exc.strerror}") from None
    options: dict[str, object] = {}
    if first.tls_certfile is not None:
        options = {"ssl_certfile": str(first.tls_certfile), "ssl_keyfile": str(first.tls_keyfile)}
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        log_config=None,
        access_log=False,
        lifespan="off",
        http=protocol_class(
            lambda: refusals.record(
                "", SLOW_REQUEST_HEAD, f"no request head within {REQUEST_HEAD_TIMEOUT_S:g} s"
            )
        ),
        ws="websockets-sansio",
        ws_max_size=max(s.max_request_bytes for s in streams) + 1024,
        ws_per_message_deflate=False,
        # The stream's trust_proxy decides whether X-Forwarded-Proto counts; uvicorn's own
        # default would trust it from any local peer and make a plain channel "secure".
        proxy_headers=False,
        **options,  # type: ignore[arg-type]
    )
    tls_on = first.tls_certfile is not None
    try:
        server, task = serve_guarded(
            config,
            sock,
            first.accept_rules(tls_on),
            first.tls_handshake_timeout.total_seconds(),
            lambda reason, address: refusals.record("", reason, f"closed at accept: {reason}"),
        )
        while not server.started:
            if task.done():
                task.result()
                raise ConfigError(f"streams: the HTTP server on {host}:{port} did not start")
            await asyncio.sleep(0.01)
    except (ssl.SSLError, OSError) as exc:
        sock.close()
        raise ConfigError(f"streams on {host}:{port}: cannot use the TLS files: {exc}") from None
    return server, task
