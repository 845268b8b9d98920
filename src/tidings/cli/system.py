"""``tidings run``: the whole deployment a file describes, on this machine, supervised
(:mod:`tidings.system.supervisor`); and the parts table ``tidings status`` adds when it runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from tidings.cli.common import ConfigOption, app, console, fail, load_or_exit
from tidings.system.state import RUN_DIR_ENV

if TYPE_CHECKING:
    from tidings.config import TidingsConfig

RunDirOption = Annotated[
    Path | None,
    typer.Option(
        "--run-dir",
        envvar=RUN_DIR_ENV,
        file_okay=False,
        help="Where `tidings run` keeps its state and lock. Default: .tidings beside the file.",
    ),
]


@app.command()
def run(config: ConfigOption = None, run_dir: RunDirOption = None) -> None:
    """Run every part the configuration describes (event servers with their streams, the
    relay, intermediaries) as supervised child processes: restarted with backoff when one
    dies, their output prefixed with their names, stopped in order on Ctrl-C or SIGTERM."""
    from tidings.system.parts import parts_of
    from tidings.system.state import RunFiles, holding_run_lock
    from tidings.system.supervisor import Supervisor, install_stop_signals

    if config is None:
        fail("tidings run needs a configuration file: -c FILE (or $TIDINGS_CONFIG)")
    settings = load_or_exit(config)
    parts = parts_of(settings, config.resolve())
    if not parts:
        fail(f"{config}: configures no part to run (no targets, servers or intermediaries)")
    files = RunFiles.of(config, run_dir)
    with holding_run_lock(files, config):
        console.print(
            f"running {len(parts)} parts of {config}: {', '.join(p.name for p in parts)} "
            "(Ctrl-C stops them in order)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        supervisor = Supervisor(parts, files)
        install_stop_signals(supervisor.stop)
        code = supervisor.run()
    raise typer.Exit(code)


def parts_status(config: Path | None, run_dir: Path | None) -> dict[str, Any] | None:
    """What the supervisor of ``config`` last wrote (None when it never ran there)."""
    from tidings.system.state import RunFiles, read_state

    return None if config is None else read_state(RunFiles.of(config, run_dir))


def part_lags(config: TidingsConfig, relay_lag: int) -> dict[str, str]:
    """Each part's lag as ``tidings status`` shows it: the relay's events not yet relayed;
    a server's stream consumer furthest behind (events it has not acknowledged)."""
    from tidings.streams.consumers.admin import open_store, stream_status

    lags = {"relay": f"{relay_lag} events"}
    for name, server in config.servers.items():
        if not server.streams:
            continue
        store = open_store(server)
        try:
            behind = [
                (consumer.behind, f"{stream.name}/{consumer.component}")
                for stream in server.streams
                for consumer in stream_status(store, stream).consumers
            ]
        finally:
            store.close()
        most, who = max(behind, default=(0, ""))
        lags[f"server.{name}"] = f"{most} events ({who})" if who else "no consumers"
    return lags


def print_parts(state: dict[str, Any], lags: dict[str, str]) -> None:
    """The parts table of ``tidings status``."""
    import time

    running = "running" if state["running"] else "not running"
    table = Table(title=f"parts (supervisor {running})")
    for column in ("part", "state", "pid", "restarts", "for", "lag"):
        table.add_column(column, justify="left" if column in ("part", "state") else "right")
    now = time.time()
    for name, part in state["parts"].items():
        shown = part["state"] if state["running"] else "down"
        table.add_row(
            name,
            shown,
            str(part["pid"] or "-"),
            str(part["restarts"]),
            f"{now - part['since']:.0f} s",
            lags.get(name, ""),
        )
    console.print(table)


def down_parts(state: dict[str, Any]) -> list[str]:
    """One problem line per part that is not up (for ``status --check``)."""
    return [
        f"part {name} is {'down' if not state['running'] else part['state']}"
        for name, part in state["parts"].items()
        if not part["up"]
    ]
