"""``tidings server``: the event server and the streams its configuration lists."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tidings.cli.common import ConfigOption, app, fail, load_or_exit, log_level_option
from tidings.errors import TidingsError
from tidings.logs import configure_logging


@app.command()
def server(
    conf: Annotated[
        Path | None,
        typer.Option(
            "--conf",
            help="Server configuration (YAML or JSON). Default: "
            "$XDG_CONFIG_HOME/tidings/event.{yaml,yml,json}.",
        ),
    ] = None,
    config: ConfigOption = None,
    name: Annotated[
        str | None,
        typer.Option(help="With -c: the server of the file's servers: section to run."),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="Log level, unless the configuration has a log section.")
    ] = "INFO",
) -> None:
    """Run a hat-event 0.8.5 compatible event server (Eventer, Syncer, modules), and the
    FTN18 streams its configuration lists under streams: — from its own file (--conf) or
    from a server of a whole deployment's file (-c FILE --name NAME)."""
    import asyncio

    from tidings.config.streams import StreamServerConfig, load_stream_server_config_file
    from tidings.server.runner import apply_logging, serve
    from tidings.streams.service.runner import streams_attachment

    configure_logging(log_level_option(log_level, "--log-level"))
    deployment: StreamServerConfig | None = None
    if name is not None:
        if conf is not None:
            fail("give --conf FILE (a server's own file) or -c FILE --name NAME, not both")
        if config is None:
            fail(f"--name {name}: names a server of a deployment's file; give it with -c FILE")
        servers = load_or_exit(config).servers
        if name not in servers:
            fail(
                f"--name {name}: no such server in {config} "
                f"(servers: {', '.join(sorted(servers)) or 'none'})"
            )
        deployment = servers[name]
    try:
        cfg = deployment or load_stream_server_config_file(conf)
        apply_logging(cfg)
        asyncio.run(serve(cfg, attach=streams_attachment(cfg)))
    except TidingsError as exc:
        fail(str(exc))
    except OSError as exc:  # e.g. the address is in use
        fail(f"cannot start the server: {exc}")
