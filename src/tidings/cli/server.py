"""``tidings server``: the event server and the streams its configuration lists."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tidings.cli.common import app, err, log_level_option
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
    log_level: Annotated[
        str, typer.Option(help="Log level, unless the configuration has a log section.")
    ] = "INFO",
) -> None:
    """Run a hat-event 0.8.5 compatible event server (Eventer, Syncer, modules), and the
    FTN18 streams its configuration lists under streams:."""
    import asyncio

    from tidings.config.streams import load_stream_server_config_file
    from tidings.server.runner import apply_logging, serve
    from tidings.streams.service.runner import streams_attachment

    configure_logging(log_level_option(log_level, "--log-level"))
    try:
        cfg = load_stream_server_config_file(conf)
        apply_logging(cfg)
        asyncio.run(serve(cfg, attach=streams_attachment(cfg)))
    except TidingsError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    except OSError as exc:  # e.g. the address is in use
        err.print(f"error: cannot start the server: {exc}", markup=False)
        raise typer.Exit(2) from None
