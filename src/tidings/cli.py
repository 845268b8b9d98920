"""The ``tidings`` command line: demo, relay, replay, housekeep, status, server, routes."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from tidings.config import TidingsConfig, load_config, load_config_file, parse_duration
from tidings.errors import TidingsError
from tidings.logs import configure_logging

if TYPE_CHECKING:
    from tidings.server.store import EventStore
    from tidings.streams.config import StreamServerConfig

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
routes_app = typer.Typer(no_args_is_help=True, help="Show and change the routing table.")
app.add_typer(routes_app, name="routes")
streams_app = typer.Typer(no_args_is_help=True, help="FTN18 streams: users, consumers, jobs.")
app.add_typer(streams_app, name="streams")
console = Console()
err = Console(stderr=True)

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML configuration file.", exists=False)
]


def _load(path: Path | None) -> TidingsConfig:
    import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names

    try:
        return load_config_file(path) if path else load_config({})
    except TidingsError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def _duration(value: str | None, flag: str) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value).total_seconds()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None


@app.callback()
def main(log_level: Annotated[str, typer.Option(help="Log level.")] = "WARNING") -> None:
    """tidings: every database change out to everyone who needs it."""
    configure_logging(log_level)


@app.command()
def demo(
    operations: Annotated[int, typer.Option(min=1, help="Domain operations to perform.")] = 3000,
    rate: Annotated[float, typer.Option(min=1, help="Operations per second offered.")] = 1000,
    workdir: Annotated[Path, typer.Option(help="Scratch directory (wiped).")] = Path(
        ".tidings/demo"
    ),
) -> None:
    """Run the publishing core end to end on the embedded default and report."""
    from tidings.demo import percentile, run_demo

    result = run_demo(workdir, operations, rate, say=lambda m: console.print(f"[dim]{m}[/dim]"))
    table = Table(title="events per status")
    table.add_column("status")
    table.add_column("events", justify="right")
    for status, count in sorted(result.report.by_status.items()):
        table.add_row(status, str(count))
    console.print(table)
    targets = Table(title="deliveries per target")
    targets.add_column("target")
    targets.add_column("confirmed", justify="right")
    targets.add_column("failed", justify="right")
    for name, counts in sorted(result.report.by_target.items()):
        targets.add_row(name, str(counts.get("confirmed", 0)), str(counts.get("failed", 0)))
    console.print(targets)
    lat = result.latencies_ms
    console.print(
        f"retries: {result.report.retries} (one transient failure injected on 'accounts')\n"
        f"latency commit -> all targets: p50 {percentile(lat, 50):.0f} ms, "
        f"p99 {percentile(lat, 99):.0f} ms, max {max(lat, default=float('nan')):.0f} ms\n"
        f"checked in the stores: missing {result.missing}, duplicates {result.duplicates}, "
        f"out of order {result.out_of_order}; wall time {result.seconds:.1f} s"
    )
    if result.ok:
        console.print("[bold green]OK: every routed event was delivered exactly once, in order.")
    else:
        console.print("[bold red]FAILED: some routed events were not delivered correctly.")
        raise typer.Exit(1)


@app.command()
def relay(
    config: ConfigOption = None,
    once: Annotated[bool, typer.Option(help="Drain what is committed, then stop.")] = False,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus metrics.")] = None,
) -> None:
    """Run the relay pipeline on Spark until interrupted (or once with --once)."""
    from tidings.db import shared_engine
    from tidings.metrics import BatchLogFollower, MetricsListener, serve_metrics
    from tidings.outbox.schema import ensure_schema
    from tidings.pipeline.relay import run_relay
    from tidings.pipeline.spark import spark_session

    cfg = _load(config)
    port = metrics_port or cfg.metrics.port
    if port:
        serve_metrics(port)
    spark = spark_session(cfg.relay, app_name="tidings-relay")
    engine = shared_engine(cfg.database.url)
    ensure_schema(engine)
    spark.streams.addListener(MetricsListener(BatchLogFollower(engine)))
    console.print("relay running; Ctrl-C stops it" if not once else "relay draining the log ...")
    try:
        run_relay(
            spark,
            cfg,
            str(config) if config else None,
            once=once,
            on_replay=lambda s: console.print(
                f"replay: {s.published} published, {s.failed} failed, {s.held} held"
            ),
        )
    except KeyboardInterrupt:
        console.print("relay stopped")
    except TidingsError as exc:
        err.print(f"[red]relay failed:[/red] {exc}")
        raise typer.Exit(1) from None


@app.command()
def replay(
    config: ConfigOption = None,
    every: Annotated[str | None, typer.Option(help="Run on a schedule, e.g. 30m.")] = None,
    older_than: Annotated[str | None, typer.Option(help="Only events older than this.")] = None,
    time_limit: Annotated[str | None, typer.Option(help="Start no new work after this.")] = None,
    event_limit: Annotated[int | None, typer.Option(min=1, help="At most this many.")] = None,
    retry_threshold: Annotated[
        int | None, typer.Option(min=1, help="Skip FAILED events retried this often.")
    ] = None,
) -> None:
    """Re-publish PENDING, HELD and FAILED events, once or on a schedule."""
    from datetime import timedelta

    from tidings.pipeline.replay import ReplayLimits, run_replay
    from tidings.pipeline.spark import spark_session

    cfg = _load(config)
    period = _duration(every, "--every")
    base = ReplayLimits.from_config(cfg)
    older = _duration(older_than, "--older-than")
    limit = _duration(time_limit, "--time-limit")
    limits = ReplayLimits(
        timedelta(seconds=older) if older is not None else base.older_than,
        retry_threshold or base.retry_count_threshold,
        timedelta(seconds=limit) if limit is not None else base.time_limit,
        event_limit or base.event_limit,
    )
    spark = spark_session(cfg.relay, app_name="tidings-replay")
    while True:
        with console.status("replaying ..."):
            s = run_replay(spark, cfg, str(config) if config else None, limits)
        console.print(
            f"replay: {s.events} considered, {s.published} published, {s.failed} failed, "
            f"{s.held} held, {s.unroutable} unroutable, {s.retries} retries"
        )
        if period is None:
            return
        time.sleep(period)


@app.command()
def housekeep(
    config: ConfigOption = None,
    older_than: Annotated[
        str | None, typer.Option(help="Override housekeeping.older_than.")
    ] = None,
    event_limit: Annotated[int | None, typer.Option(min=1, help="At most this many.")] = None,
) -> None:
    """Archive (Parquet) and delete published events older than the configured interval."""
    from datetime import timedelta

    from rich.progress import Progress

    from tidings.pipeline.housekeeping import run_housekeeping
    from tidings.pipeline.spark import spark_session

    cfg = _load(config)
    older = _duration(older_than, "--older-than")
    spark = spark_session(cfg.relay, app_name="tidings-housekeeping")
    with Progress(console=console) as progress:
        task = progress.add_task("housekeeping", total=None)
        result = run_housekeeping(
            spark,
            cfg,
            older_than=timedelta(seconds=older) if older is not None else None,
            event_limit=event_limit,
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    where = f" into {result.archive_path}" if result.archive_path else ""
    console.print(f"{result.mode}: deleted {result.deleted}, archived {result.archived}{where}")


@app.command()
def status(config: ConfigOption = None) -> None:
    """Counts per status and per target, the oldest open event's age, the last errors."""
    from tidings.db import make_engine
    from tidings.status import status_report

    cfg = _load(config)
    try:
        report = status_report(make_engine(cfg.database.url))
    except TidingsError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    table = Table(title="events per status")
    table.add_column("status")
    table.add_column("events", justify="right")
    for name, count in sorted(report.by_status.items()):
        table.add_row(name, str(count))
    console.print(table)
    targets = Table(title="deliveries per target")
    for col in ("target", "confirmed", "failed"):
        targets.add_column(col)
    for name, counts in sorted(report.by_target.items()):
        targets.add_row(name, str(counts.get("confirmed", 0)), str(counts.get("failed", 0)))
    console.print(targets)
    age = report.oldest_open_age
    console.print(
        f"oldest open event: {age.total_seconds():.1f} s old" if age else "no open events"
    )
    for seq, etype, error in report.last_errors:
        console.print(f"[red]seq {seq}[/red] {etype}: {error}")


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

    from tidings.server.runner import apply_logging, serve
    from tidings.streams.config import load_stream_server_config_file
    from tidings.streams.runner import streams_attachment

    configure_logging(log_level)
    try:
        cfg = load_stream_server_config_file(conf)
        apply_logging(cfg)
        asyncio.run(serve(cfg, attach=streams_attachment(cfg)))
    except TidingsError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    except OSError as exc:  # e.g. the address is in use
        err.print(f"[red]error:[/red] cannot start the server: {exc}")
        raise typer.Exit(2) from None


@routes_app.command("list")
def routes_list(config: ConfigOption = None) -> None:
    """Show the routes in force (configuration merged with the database table)."""
    from tidings.db import make_engine
    from tidings.outbox.schema import ensure_schema
    from tidings.routing.table import current_routes

    cfg = _load(config)
    engine = make_engine(cfg.database.url)
    ensure_schema(engine)
    for event_type, targets in sorted(current_routes(cfg, engine).by_type.items()):
        console.print(f"{event_type} -> {', '.join(targets)}")


@routes_app.command("add")
def routes_add(event_type: str, target: str, config: ConfigOption = None) -> None:
    """Route EVENT_TYPE to TARGET from the next micro-batch on."""
    from tidings.db import make_engine
    from tidings.outbox.schema import ensure_schema
    from tidings.routing.table import add_route

    cfg = _load(config)
    if target not in cfg.targets:
        err.print(
            f"[red]error:[/red] unknown target {target!r} "
            f"(defined: {', '.join(sorted(cfg.targets)) or 'none'})"
        )
        raise typer.Exit(2)
    engine = make_engine(cfg.database.url)
    ensure_schema(engine)
    add_route(engine, event_type, target)
    console.print(f"{event_type} -> {target} added")


@routes_app.command("remove")
def routes_remove(event_type: str, target: str, config: ConfigOption = None) -> None:
    """Stop routing EVENT_TYPE to TARGET (routes in the database table only)."""
    from tidings.db import make_engine
    from tidings.outbox.schema import ensure_schema
    from tidings.routing.table import remove_route

    cfg = _load(config)
    engine = make_engine(cfg.database.url)
    ensure_schema(engine)
    if not remove_route(engine, event_type, target):
        err.print(f"no route {event_type} -> {target} in the table")
        raise typer.Exit(1)
    console.print(f"{event_type} -> {target} removed")


@app.command()
def consume(
    url: Annotated[str, typer.Argument(help="The stream's URL, e.g. http://127.0.0.1:8090/evt")],
    component: Annotated[
        str, typer.Argument(help="Consumer component (1-16 of A-Z a-z 0-9 _); LIVE is live.")
    ],
    live: Annotated[bool, typer.Option(help="Consume live (component LIVE).")] = False,
    want: Annotated[
        str | None, typer.Option(help="Only these FTN18 types, comma separated.")
    ] = None,
    poll: Annotated[bool, typer.Option(help="Poll over HTTP instead of push.")] = False,
    count: Annotated[int | None, typer.Option(min=1, help="Stop after this many events.")] = None,
    user: Annotated[
        str, typer.Option(envvar="TIDINGS_STREAM_USER", help="User (env TIDINGS_STREAM_USER).")
    ] = "",
    password: Annotated[
        str,
        typer.Option(
            envvar="TIDINGS_STREAM_PASSWORD",
            help="Password (env TIDINGS_STREAM_PASSWORD; prompted for if unset).",
        ),
    ] = "",
) -> None:
    """Consume an FTN18 stream and print its events as JSON lines (reliable unless --live)."""
    import asyncio
    import json

    from tidings.errors import StreamError
    from tidings.streams.client import LIVE, StreamEvent, consume

    if not user:
        err.print("[red]error:[/red] give --user or set TIDINGS_STREAM_USER")
        raise typer.Exit(2)
    if not password:
        password = typer.prompt("password", hide_input=True)
    if live:
        component = LIVE
    wanted = [t.strip() for t in want.split(",") if t.strip()] if want is not None else None
    printed = 0
    done = asyncio.Event()

    async def show(event: StreamEvent) -> None:
        nonlocal printed
        if done.is_set():
            await asyncio.Event().wait()  # past --count: never acknowledge more
        sys.stdout.write(json.dumps(event.as_dict(), separators=(",", ":")) + "\n")
        sys.stdout.flush()
        printed += 1
        if count is not None and printed >= count:
            done.set()

    async def run() -> None:
        task = asyncio.create_task(
            consume(url, user, password, component, show, want=wanted, push=not poll)
        )
        waiter = asyncio.create_task(done.wait())
        finished, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        for pending in (task, waiter):
            pending.cancel()
        if task in finished:
            task.result()

    try:
        asyncio.run(run())
    except StreamError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


ServerConfOption = Annotated[
    Path | None,
    typer.Option(
        "--conf",
        help="Server configuration (YAML or JSON). Default: "
        "$XDG_CONFIG_HOME/tidings/event.{yaml,yml,json}.",
    ),
]


def _stream_store(conf: Path | None) -> tuple[StreamServerConfig, EventStore]:
    """The server configuration with streams and its store, or a clear exit."""
    from tidings.streams.admin import open_store
    from tidings.streams.config import load_stream_server_config_file

    try:
        config = load_stream_server_config_file(conf)
        return config, open_store(config)
    except TidingsError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None


@streams_app.command("status")
def streams_status(
    conf: ServerConfOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Each stream's retained ids and its consumers' positions and lag."""
    import json

    from tidings.streams.admin import stream_status

    config, store = _stream_store(conf)
    try:
        statuses = [stream_status(store, stream) for stream in config.streams]
    except TidingsError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None
    finally:
        store.close()
    if as_json:
        sys.stdout.write(json.dumps([s.as_dict() for s in statuses], indent=2) + "\n")
        return
    if not statuses:
        console.print("no streams configured")
    for status in statuses:
        span = (
            f"ids {status.first_id}..{status.last_id}" if status.last_id is not None else "empty"
        )
        retention = "retention on" if status.retention else "keeps everything"
        console.print(f"{status.name} ({status.endpoint}): {span}, {retention}", markup=False)
        for c in status.consumers:
            acked = c.acked_at.isoformat(timespec="seconds") if c.acked_at else "never"
            console.print(
                f"  {c.user}:{c.component} at {c.position}, {c.behind} behind, "
                f"last acknowledged {acked}",
                markup=False,
            )


@streams_app.command("unregister")
def streams_unregister(
    stream: str, user: str, component: str, conf: ServerConfOption = None
) -> None:
    """Forget a registered consumer, so that it no longer holds events back."""
    from tidings.streams.admin import unregister

    config, store = _stream_store(conf)
    try:
        if stream not in {s.name for s in config.streams}:
            err.print(f"error: no stream {stream!r} in the configuration", markup=False)
            raise typer.Exit(2)
        if not unregister(store, stream, user, component):
            err.print(f"no consumer {user}:{component} of stream {stream}", markup=False)
            raise typer.Exit(1)
    finally:
        store.close()
    console.print(f"{user}:{component} of {stream} unregistered", markup=False)


@streams_app.command("hash-password")
def streams_hash_password() -> None:
    """Print the hash of a password (read from stdin, or prompted for) for stream_users."""
    from tidings.streams.auth import hash_password

    if sys.stdin.isatty():
        password = typer.prompt("password", hide_input=True, confirmation_prompt=True)
    else:
        password = sys.stdin.readline().rstrip("\n")
    try:
        sys.stdout.write(hash_password(password) + "\n")
    except TidingsError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2) from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
