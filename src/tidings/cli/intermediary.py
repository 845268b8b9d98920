"""``tidings intermediary serve``: an intermediary in production, fed by an event server.

It runs :func:`tidings.intermediary.service.serve_intermediary` with the ``intermediary:``
section of the configuration until SIGINT or SIGTERM (exit 0). An unreachable event server,
an address in use or a bad configuration end it with one line and exit code 2; so does
losing the event server's connection while serving (a supervisor restarts it).
"""

from __future__ import annotations

from typing import Annotated

import typer

from tidings.cli.common import ConfigOption, app, console, load_or_exit, log_level_option
from tidings.logs import configure_logging

intermediary_app = typer.Typer(
    no_args_is_help=True, help="Intermediaries: live event and SQL views for many subscribers."
)
app.add_typer(intermediary_app, name="intermediary")


@intermediary_app.command("serve")
def serve(
    config: ConfigOption = None,
    log_level: Annotated[str, typer.Option(help="Log level of the JSON-line logs.")] = "INFO",
) -> None:
    """Serve event and SQL-view subscriptions over WebSocket (and the page at /live),
    fed by the event server of the configuration's intermediary: section."""
    import asyncio
    import signal

    from tidings.intermediary.service import Listening, serve_intermediary

    configure_logging(log_level_option(log_level, "--log-level"))
    settings = load_or_exit(config).intermediary

    def listening(where: Listening) -> None:
        console.print(
            f"intermediary listening on {where.websocket} (page: {where.page}), "
            f"fed by the event server {where.event_server}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await serve_intermediary(settings, stop, listening)

    asyncio.run(run())


__all__ = ["intermediary_app", "serve"]
