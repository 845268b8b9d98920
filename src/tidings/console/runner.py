"""``tidings console``: the console's application served by uvicorn, with its sampler.

The sampler takes an :class:`~tidings.console.overview.Overview` every ``sample_every`` in a
worker thread and keeps its figures in the :class:`~tidings.console.history.History`; the
overview page shows the newest one. The socket is bound before uvicorn starts (a port in
use is an error at start-up, as for the streams), and SIGINT or SIGTERM stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import time
from pathlib import Path

import uvicorn

from tidings.config import TidingsConfig
from tidings.config.console import ConsoleConfig
from tidings.console.actions import Actions, OutboxEvents
from tidings.console.app import ConsoleState, build_app
from tidings.console.audit import AuditTrail
from tidings.console.history import History, Sample
from tidings.console.logins import Logins
from tidings.console.overview import Overview, take_overview
from tidings.db import make_engine
from tidings.errors import ConfigError
from tidings.serving import QuietServer, listen, serve_guarded
from tidings.tasks import stop_task

log = logging.getLogger(__name__)


def console_state(config: TidingsConfig, settings: ConsoleConfig) -> ConsoleState:
    """The console's state over ``config``'s outbox; a missing password variable is a
    ConfigError (before anything listens)."""
    logins = Logins.of(settings)
    outbox = OutboxEvents(config, make_engine(config.database.url))
    audit = AuditTrail(settings.audit_file)
    return ConsoleState(
        config=config,
        settings=settings,
        logins=logins,
        outbox=outbox,
        actions=Actions(outbox, audit),
        audit=audit,
        history=History(settings.history.total_seconds()),
        secure_cookie=settings.tls is not None,
    )


def record(state: ConsoleState, overview: Overview) -> None:
    """Make ``overview`` the newest, and keep its figures in the history."""
    state.overview = overview
    health = overview.health
    if health is not None:
        state.history.add(
            Sample(
                at=overview.at,
                newest_seq=health.newest_seq or 0,
                relayed_seq=health.relayed_seq or 0,
                lag_events=health.lag_events,
                lag_seconds=health.lag_seconds,
                open_events=health.open_events,
                failed=health.counts.get("FAILED", 0),
            )
        )


async def sample_forever(state: ConsoleState, config_path: Path | None) -> None:
    """Take an overview every ``sample_every``, for as long as the console runs."""
    every = state.settings.sample_every.total_seconds()
    loop = asyncio.get_running_loop()
    while True:
        started = time.monotonic()
        try:
            overview = await loop.run_in_executor(
                None, take_overview, state.config, config_path, state.outbox.engine
            )
            record(state, overview)
        except Exception:
            log.exception("console: sampling failed")
        await asyncio.sleep(max(0.0, every - (time.monotonic() - started)))


class RunningConsole:
    """The console serving on its socket, and its sampler; :meth:`aclose` stops both."""

    def __init__(self, state: ConsoleState, server: QuietServer, tasks: list[asyncio.Task[None]]):
        self.state = state
        self.server = server
        self.tasks = tasks

    @classmethod
    async def start(cls, state: ConsoleState, config_path: Path | None) -> RunningConsole:
        """Serve ``state`` on its configured address and start sampling; a ConfigError if
        the port is taken or the TLS files are unusable."""
        settings = state.settings
        try:
            sock = listen(settings.host, settings.port)
        except OSError as exc:
            raise ConfigError(
                f"console: cannot listen on {settings.host}:{settings.port}: {exc.strerror}"
            ) from None
        options: dict[str, object] = {}
        if settings.tls is not None:
            options = {"ssl_certfile": settings.tls.cert_file}
            if settings.tls.key_file is not None:
                options["ssl_keyfile"] = settings.tls.key_file
        server_config = uvicorn.Config(
            build_app(state),
            log_config=None,
            access_log=False,
            lifespan="off",
            proxy_headers=False,
            **options,  # type: ignore[arg-type]
        )
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(sample_forever(state, config_path))]
        try:
            server, serving = serve_guarded(
                server_config,
                sock,
                settings.accept_rules(settings.tls is not None),
                settings.tls_handshake_timeout.total_seconds(),
            )
            tasks.append(serving)
            while not server.started:
                if tasks[-1].done():
                    tasks[-1].result()
                    raise ConfigError("console: the HTTP server did not start")
                await asyncio.sleep(0.01)
        except (ssl.SSLError, OSError) as exc:
            sock.close()
            for task in tasks:
                await stop_task(task)
            raise ConfigError(f"console: cannot use the TLS files: {exc}") from None
        log.info("console serving", extra={"url": settings.url})
        return cls(state, server, tasks)

    async def aclose(self) -> None:
        """Stop serving and sampling (the state's engines stay: :func:`close_state`)."""
        self.state.closing = True  # the live tails end, so their connections close
        self.server.should_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            async with asyncio.timeout(10):
                await self.tasks[-1]
        for task in self.tasks:
            await stop_task(task)


def close_state(state: ConsoleState) -> None:
    """Release the state's database connections."""
    state.outbox.engine.dispose()
    state.audit.close()


async def serve_console(config: TidingsConfig, config_path: Path | None) -> None:
    """Run the console of ``config`` until SIGINT or SIGTERM."""
    if config.console is None:
        raise ConfigError("the configuration has no console: section")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    state = console_state(config, config.console)
    try:
        running = await RunningConsole.start(state, config_path)
        try:
            await stop.wait()
        finally:
            await running.aclose()
    finally:
        close_state(state)
