"""``tidings intermediary serve``: an intermediary in production, fed by an event server
(and, with its ``spatial:`` section, a spatial publisher); ``tidings intermediary simulate``:
such a publisher, a simulation of moving agents.

It runs :func:`tidings.intermediary.serving.service.serve_intermediary` with the ``intermediary:``
section of the configuration until SIGINT or SIGTERM (exit 0). No event server reachable at
start, an address in use or a bad configuration end it with one line and exit code 2; a
connection lost while serving is ridden out (the service reconnects and resynchronises). With
``--tier NAME`` it runs the ``intermediary_tiers:`` entry NAME instead: every member as its own
process, responsibility split among them, a dead member's share moved to the others and the
member replaced (:mod:`tidings.intermediary.cluster.tier`); a member that cannot start ends it
with one line and exit code 2.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tidings.cli.common import ConfigOption, app, console, fail, load_or_exit, log_level_option
from tidings.logs import configure_logging

if TYPE_CHECKING:
    import asyncio
    import ssl

    from tidings.config.intermediary_tier import IntermediaryTierConfig

intermediary_app = typer.Typer(
    no_args_is_help=True,
    help="Intermediaries: live event, SQL and spatial views for many subscribers.",
)
app.add_typer(intermediary_app, name="intermediary")


@intermediary_app.command("serve")
def serve(
    config: ConfigOption = None,
    name: Annotated[
        str | None,
        typer.Option(help="The intermediary of the file's intermediaries: section to run."),
    ] = None,
    tier: Annotated[
        str | None,
        typer.Option(help="The tier of the file's intermediary_tiers: section to run."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="Log level of the JSON-line logs.")] = "INFO",
) -> None:
    """Serve event and SQL-view subscriptions over WebSocket (and the page at /live),
    fed by the event server of the configuration's intermediary: section; with --tier, a
    tier of intermediaries serving region subscriptions, each member its own process."""
    from tidings.intermediary.serving.service import Listening, serve_intermediary

    configure_logging(log_level_option(log_level, "--log-level"))
    for option, value, what in (("--name", name, "an intermediary"), ("--tier", tier, "a tier")):
        if value is not None and config is None:
            fail(f"{option} {value}: names {what} of a deployment's file; give it with -c FILE")
    if name is not None and tier is not None:
        fail("--name and --tier: give one (a tier's members are not intermediaries: sections)")
    loaded = load_or_exit(config)
    if tier is not None:
        if tier not in loaded.intermediary_tiers:
            found = ", ".join(sorted(loaded.intermediary_tiers)) or "none"
            fail(f"--tier {tier}: no such tier in {config} (intermediary_tiers: {found})")
        _serve_tier(tier, loaded.intermediary_tiers[tier])
        return
    settings = loaded.intermediary
    if name is not None:
        if name not in loaded.intermediaries:
            found = ", ".join(sorted(loaded.intermediaries)) or "none"
            fail(f"--name {name}: no such intermediary in {config} (intermediaries: {found})")
        settings = loaded.intermediaries[name]

    def listening(where: Listening) -> None:
        spatial = "" if where.spatial is None else f" and the spatial publisher {where.spatial}"
        metrics = "" if where.metrics is None else f"; metrics at {where.metrics}"
        _say(
            f"intermediary listening on {where.websocket} (page: {where.page}), "
            f"fed by the event server {where.event_server}{spatial}{metrics}"
        )

    _until_signalled(lambda stop: serve_intermediary(settings, stop, listening))


def _until_signalled(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``serve(stop)`` on a new event loop, ``stop`` set by SIGINT or SIGTERM: how every
    command here ends cleanly (exit 0) when the operator or the service manager stops it."""
    import asyncio
    import signal

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await serve(stop)

    asyncio.run(run())


def _say(line: str) -> None:
    """Print one status line as it is (no markup, no highlighting, never wrapped), so that a
    script or a test can read the addresses in it."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def _serve_tier(name: str, settings: IntermediaryTierConfig) -> None:
    """Run tier ``name`` until SIGINT or SIGTERM; one line once every member serves."""
    from tidings.intermediary.cluster.process_cluster import MemberProcess
    from tidings.intermediary.cluster.tier import serve_tier

    def ready(members: list[MemberProcess]) -> None:
        listed = ", ".join(f"{member.name} {member.url}" for member in members)
        _say(
            f"intermediary tier {name} serving: {listed}; fed by the spatial publisher "
            f"{settings.spatial.upstream}"
        )

    _until_signalled(lambda stop: serve_tier(name, settings, stop, ready))


@intermediary_app.command("simulate")
def simulate(
    agents: Annotated[int, typer.Option(min=0, max=10_000_000, help="Moving agents.")] = 10_000,
    world: Annotated[
        float, typer.Option(min=1e-6, max=1e9, help="The world's side: [0, WORLD] per axis.")
    ] = 1000.0,
    dim: Annotated[int, typer.Option(min=2, max=3, help="2 or 3 dimensions.")] = 2,
    speed: Annotated[float, typer.Option(min=0.0, max=1e9, help="Top speed, units/s.")] = 5.0,
    tick_hz: Annotated[float, typer.Option(min=0.01, max=1000.0, help="Ticks a second.")] = 10.0,
    listen: Annotated[str, typer.Option(help="HOST:PORT to serve the spatial feed on.")] = (
        "127.0.0.1:8200"
    ),
    seed: Annotated[int, typer.Option(help="Seed of the agents' start (reproducible).")] = 0,
    tls_cert_file: Annotated[
        Path | None,
        typer.Option(help="Serve the feed over TLS (wss://) with this certificate chain (PEM)."),
    ] = None,
    tls_key_file: Annotated[
        Path | None,
        typer.Option(help="The key of --tls-cert-file (PEM, not encrypted), if not in it."),
    ] = None,
    tls_client_ca_file: Annotated[
        Path | None,
        typer.Option(help="Mutual TLS: intermediaries must present a certificate of this CA."),
    ] = None,
    max_connections_per_address: Annotated[
        int,
        typer.Option(
            min=1,
            max=1_000_000,
            help="Connections at once from one client address; more are closed at accept.",
        ),
    ] = 100,
    tls_handshake_timeout: Annotated[
        float,
        typer.Option(
            min=0.001,
            max=300.0,
            help="Over TLS: seconds a new connection may stay silent, then take to handshake.",
        ),
    ] = 10.0,
) -> None:
    """Serve a simulation of moving agents over the spatial feed: the upstream that
    ``intermediary serve`` (its spatial: section) and the library's intermediaries take
    region subscriptions from. Runs until SIGINT or SIGTERM."""

    from tidings.errors import IntermediaryError
    from tidings.intermediary.publisher.server import SimulationServer
    from tidings.intermediary.publisher.simulation import Simulation
    from tidings.intermediary.regions.geometry import Box

    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise IntermediaryError(
            f"--listen: expected HOST:PORT, e.g. 127.0.0.1:8200, got {listen!r}"
        )
    tls = _server_tls(tls_cert_file, tls_key_file, tls_client_ca_file)
    box = Box((0.0,) * dim, (world,) * dim)
    simulation = Simulation(agents, box, max_speed=speed, seed=seed)

    async def run(stop: asyncio.Event) -> None:
        server = SimulationServer(
            simulation,
            tick_hz,
            tls,
            max_connections_per_address=max_connections_per_address,
            tls_handshake_timeout=tls_handshake_timeout,
        )
        url = await server.start(host.strip("[]"), int(port))
        _say(
            f"simulation of {agents} agents in a {dim}D world of side {world:g} at "
            f"{tick_hz:g} Hz, serving the spatial feed on {url}"
        )
        try:
            await stop.wait()
        finally:
            await server.aclose()

    _until_signalled(run)


def _server_tls(
    cert: Path | None, key: Path | None, client_ca: Path | None
) -> ssl.SSLContext | None:
    """The TLS context of the ``--tls-*`` options (None without them); a file that cannot be
    used ends the command with one line naming it."""
    from tidings.config.tls import TlsServerConfig
    from tidings.errors import TidingsError

    if cert is None and key is None and client_ca is None:
        return None
    if cert is None:
        fail("--tls-cert-file: needed with --tls-key-file and --tls-client-ca-file")
    settings = TlsServerConfig.model_construct(
        cert_file=str(cert),
        key_file=None if key is None else str(key),
        ca_file=None if client_ca is None else str(client_ca),
    )
    try:
        return settings.context()
    except TidingsError as exc:  # names the file and what is wrong with it
        fail(f"--tls-*: {exc}")


@intermediary_app.command("new-token")
def new_token() -> None:
    """Print a new random token for a subscriber (give it to the subscriber) and, on the
    next line, its hash (the subscriber's token_hash in the configuration)."""
    from tidings.config.passwords import hash_token
    from tidings.config.passwords import new_token as make_token

    token = make_token()
    sys.stdout.write(f"{token}\n{hash_token(token)}\n")


__all__ = ["intermediary_app", "new_token", "serve", "simulate"]
