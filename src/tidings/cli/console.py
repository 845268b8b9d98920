"""``tidings console``: the operator's web console of a deployment's file."""

from __future__ import annotations

from typing import Annotated

import typer

from tidings.cli.common import ConfigOption, app, fail, load_or_exit, log_level_option
from tidings.errors import TidingsError
from tidings.logs import configure_logging


@app.command()
def console(
    config: ConfigOption = None,
    log_level: Annotated[str, typer.Option(help="Log level.")] = "INFO",
) -> None:
    """Serve the operator's web console of the file's console: section: the deployment at a
    glance, the incomplete events (resubmit, park, unpark, re-drive), the audit trail."""
    import asyncio

    from tidings.console.runner import serve_console

    configure_logging(log_level_option(log_level, "--log-level"))
    if config is None:
        fail("tidings console needs a configuration file: -c FILE (or $TIDINGS_CONFIG)")
    settings = load_or_exit(config)
    if settings.console is None:
        fail(f"{config}: has no console: section (where to listen, its users)")
    try:
        asyncio.run(serve_console(settings, config.resolve()))
    except TidingsError as exc:
        fail(str(exc))
