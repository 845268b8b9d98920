"""Shared parts of the ``tidings`` command line: the application, consoles and options."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tidings.config import TidingsConfig, load_config, load_config_file, parse_duration
from tidings.errors import TidingsError
from tidings.logs import configure_logging

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="The tidings command line: demo, relay, replay, housekeep, status, server, routes, "
    "events, config, consume, streams.",
)
routes_app = typer.Typer(no_args_is_help=True, help="Show and change the routing table.")
app.add_typer(routes_app, name="routes")
events_app = typer.Typer(
    no_args_is_help=True, help="Incomplete events: list, resubmit, park and unpark them."
)
app.add_typer(events_app, name="events")
config_app = typer.Typer(no_args_is_help=True, help="Check the configuration, export its schema.")
app.add_typer(config_app, name="config")
streams_app = typer.Typer(no_args_is_help=True, help="FTN18 streams: users, consumers, jobs.")
app.add_typer(streams_app, name="streams")
console = Console()
err = Console(stderr=True)

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML configuration file.", exists=False)
]


def load_or_exit(path: Path | None) -> TidingsConfig:
    import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names

    try:
        return load_config_file(path) if path else load_config({})
    except TidingsError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None


def seconds_option(value: str | None, flag: str) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value).total_seconds()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None


@app.callback()
def main(log_level: Annotated[str, typer.Option(help="Log level.")] = "WARNING") -> None:
    """tidings: every database change out to everyone who needs it."""
    configure_logging(log_level_option(log_level, "--log-level"))


def log_level_option(value: str, flag: str) -> str:
    """A logging level name given on the command line, or a usage error naming the choices."""
    if value.upper() not in LOG_LEVELS:
        raise typer.BadParameter(
            f"{value!r} is not a log level (use one of {', '.join(LOG_LEVELS)})", param_hint=flag
        )
    return value.upper()


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


ServerConfOption = Annotated[
    Path | None,
    typer.Option(
        "--conf",
        help="Server configuration (YAML or JSON). Default: "
        "$XDG_CONFIG_HOME/tidings/event.{yaml,yml,json}.",
    ),
]
