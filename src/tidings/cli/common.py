"""Shared parts of the ``tidings`` command line: the application, consoles and options.

Bad input and a bad environment end a command with one line on stderr and exit code 2,
never a traceback: commands raise, and :class:`OneLineErrors` (the application's command
group) turns tidings' errors, an unreachable or unusable database and OS errors (an address
in use, a permission) into that line, printed literally (no rich markup) and without the
secrets of the configuration read.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from typer.core import TyperGroup

from tidings.config import (
    CONFIG_ENV,
    TidingsConfig,
    find_config_file,
    load_config_file,
    parse_duration,
    validate_config,
)
from tidings.errors import TidingsError
from tidings.logs import configure_logging
from tidings.redaction import hide_url_passwords, scrub

log = logging.getLogger(__name__)


def one_line_error(exc: BaseException) -> str | None:
    """The one line a command ends with for ``exc``, or None for an error that is a bug
    (whose traceback must be seen). Database errors are recognised only once SQLAlchemy is
    loaded (commands import it lazily, so ``--help`` does not pay for it)."""
    if isinstance(exc, TidingsError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{exc}"
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is not None and isinstance(
        exc, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.ArgumentError
    ):
        orig = getattr(exc, "orig", None) or exc
        text = "; ".join(line.strip() for line in str(orig).splitlines() if line.strip())
        where = getattr(exc, "tidings_database", None)
        return f"database {where}: {text}" if where else f"database: {text}"
    return None


class OneLineErrors(TyperGroup):
    """The command group of ``tidings``: an error of bad input or environment that a command
    lets through ends it with ``error: <message>`` on stderr and exit code 2.

    One place for every command (also under ``typer.testing.CliRunner``, which invokes the
    group rather than the console-script entry point); ``--log-level DEBUG`` logs the
    traceback too.
    """

    # ``ctx`` is typer's vendored click context, a private type (``typer._click``)
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            message = one_line_error(exc)
            if message is None:
                raise
            log.debug("command failed", exc_info=exc)
            fail(message)


def fail(message: str) -> NoReturn:
    """End the command with ``error: message`` (printed literally, secrets scrubbed:
    :func:`tidings.redaction.scrub`) and exit code 2."""
    err.print(f"error: {scrub(message)}", markup=False, highlight=False)
    raise typer.Exit(2)


app = typer.Typer(
    cls=OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    help="The tidings command line: demo, relay, replay, housekeep, status, server, routes, "
    "events, config, consume, streams, intermediary, tls, fanout-demo.",
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
err = Console(stderr=True, soft_wrap=True)  # an error is one line, however long

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        envvar=CONFIG_ENV,
        callback=find_config_file,  # so the command also sees ./tidings.yaml as its file
        help=f"YAML configuration file. Default: ${CONFIG_ENV}, else ./tidings.yaml if there.",
    ),
]


def load_or_exit(path: Path | None) -> TidingsConfig:
    """The configuration of ``path`` (the ``-c`` option, which has looked at $TIDINGS_CONFIG
    and ./tidings.yaml); a missing or invalid file ends the command with exit code 2.

    With no file at all the defaults are used, relative to the working directory, and one
    line on stderr says so and where the database is: a ``tidings.db`` must not appear
    without the user being told.
    """
    import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names

    path = find_config_file(path)
    try:
        if path is not None:
            return load_config_file(path)
        config = validate_config(TidingsConfig, {}, base_dir=Path.cwd())
    except TidingsError as exc:
        fail(str(exc))
    err.print(
        f"note: no configuration given (-c, ${CONFIG_ENV} or ./tidings.yaml): using the "
        f"defaults (database {hide_url_passwords(config.database.url)})",
        markup=False,
        highlight=False,
    )
    return config


def require_target(config: TidingsConfig, name: str) -> None:
    """End the command with one line if ``name`` is not a target of ``config``."""
    if name not in config.targets:
        fail(f"unknown target {name!r} (defined: {', '.join(sorted(config.targets)) or 'none'})")


def event_ids(values: list[str], what: str = "event id") -> list[str]:
    """``values`` as event ids (UUIDs, in their canonical form), or one line naming the first
    that is not one and exit 2: a mistyped id must not be answered as if it were only unknown."""
    import uuid

    ids = []
    for value in values:
        try:
            ids.append(str(uuid.UUID(value)))
        except ValueError:
            fail(f"{value!r} is not an {what} (event ids are UUIDs, as `events list` shows them)")
    return ids


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
