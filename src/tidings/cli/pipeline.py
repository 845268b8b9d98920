"""``tidings`` commands of the publishing pipeline: relay, replay, housekeep, status, routes."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from tidings.cli.common import (
    ConfigOption,
    app,
    console,
    err,
    fail,
    load_or_exit,
    require_target,
    routes_app,
    seconds_option,
)
from tidings.cli.relay_progress import RelayProgress, run_summary, stop_on_signals
from tidings.cli.system import RunDirOption, down_parts, part_lags, parts_status, print_parts
from tidings.errors import TidingsError
from tidings.logs import process_age_s
from tidings.redaction import scrub

if TYPE_CHECKING:
    from pathlib import Path

    from tidings.pipeline.standby import RelayLeaseState
    from tidings.pipeline.status import HealthReport

log = logging.getLogger(__name__)


@app.command()
def relay(
    config: ConfigOption = None,
    once: Annotated[bool, typer.Option(help="Drain what is committed, then stop.")] = False,
    metrics_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Serve Prometheus metrics.")
    ] = None,
    metrics_address: Annotated[
        str | None, typer.Option(help="Interface for /metrics (default metrics.address).")
    ] = None,
    make_class_archive: Annotated[
        bool,
        typer.Option(
            help="Make relay.jvm_class_archive (Spark's driver classes, for a faster start) "
            "with a relay run on a scratch outbox, then stop."
        ),
    ] = False,
) -> None:
    """Run the relay pipeline on Spark until interrupted (or once with --once).

    One relay publishes from an outbox (it holds the relay lease); another started on it
    stands by and takes over when the first dies. SIGINT (Ctrl-C) and SIGTERM stop it
    cleanly: the query stops, the lease is released, a summary line is printed and the exit
    code is 0.

    Each step of the start is logged (INFO) with the seconds since the process started
    (``since_start_s``): ``relay command started``, ``... imports loaded``, ``...
    configuration loaded``, ``... spark session up``, then the relay's own (lease, query,
    first batch: see the design notes on the relay's start).
    """
    _started("relay command started")
    if make_class_archive:
        _make_class_archive(config)
        return
    from tidings.db import shared_engine
    from tidings.outbox.schema import ensure_schema
    from tidings.pipeline.metrics import BatchLogFollower, RelayMetrics, serve_metrics
    from tidings.pipeline.relay import run_relay
    from tidings.pipeline.spark import spark_session
    from tidings.routing.table import current_routes

    _started("relay imports loaded")
    cfg = load_or_exit(config)
    engine = shared_engine(cfg.database.url)
    metrics = RelayMetrics(cfg.metrics.max_event_types)
    ensure_schema(engine)  # an unreachable database or a port in use: one line, exit 2
    _started("relay configuration loaded")
    port = metrics_port or cfg.metrics.port
    if port:
        serve_metrics(metrics.registry, port, metrics_address or cfg.metrics.address)
    follower = BatchLogFollower(engine, metrics, lambda: current_routes(cfg, engine))
    spark = spark_session(cfg.relay, app_name="tidings-relay")
    _started("relay spark session up")
    console.print("relay running; Ctrl-C stops it" if not once else "relay draining the log ...")
    started = time.monotonic()
    progress = RelayProgress(follower, started)
    try:
        with stop_on_signals() as stop, progress:
            run_relay(
                spark,
                cfg,
                str(config) if config else None,
                once=once,
                stop=stop,
                on_replay=lambda s: console.print(
                    f"replay: {s.published} published, {s.failed} failed, {s.held} held"
                ),
                on_tick=progress.tick,
                on_standby=lambda holder: console.print(
                    f"relay standing by: another relay holds the relay lease ({holder}); "
                    "taking over when it stops renewing it",
                    markup=False,
                    soft_wrap=True,
                ),
                on_active=lambda: console.print("relay active: holds the relay lease"),
            )
    except TidingsError as exc:
        err.print(f"relay failed: {scrub(str(exc))}", markup=False)
        raise typer.Exit(1) from None
    follower.poll()  # what the last batches logged
    what = "relay --once" if once else "relay stopped"
    console.print(
        f"{what}: {run_summary(follower.total, time.monotonic() - started)}",
        markup=False,
        soft_wrap=True,
    )


def _make_class_archive(config: Path | None) -> None:
    from tidings.pipeline.class_archive import make_class_archive

    cfg = load_or_exit(config)
    with console.status("making the class archive (a relay run on a scratch outbox) ..."):
        path = make_class_archive(cfg)
    size = path.stat().st_size / 2**20
    console.print(f"class archive made: {path} ({size:.0f} MiB)", markup=False, soft_wrap=True)


def _started(step: str) -> None:
    """Log a step of the relay's start, with the seconds since the process started."""
    log.info(step, extra={"since_start_s": process_age_s()})


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

    cfg = load_or_exit(config)
    period = seconds_option(every, "--every")
    base = ReplayLimits.from_config(cfg)
    older = seconds_option(older_than, "--older-than")
    limit = seconds_option(time_limit, "--time-limit")
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

    from tidings.pipeline.housekeeping.run import run_housekeeping
    from tidings.pipeline.spark import spark_session

    cfg = load_or_exit(config)
    older = seconds_option(older_than, "--older-than")
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
def status(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Health check: exit 1 and name each problem.")
    ] = False,
    errors: Annotated[int, typer.Option(min=0, help="How many last errors to show.")] = 10,
    max_lag: Annotated[
        int | None, typer.Option(min=0, help="--check: most events the relay may lag.")
    ] = None,
    max_lag_seconds: Annotated[
        str | None, typer.Option(help="--check: oldest event not yet relayed, e.g. 5m.")
    ] = "5m",
    max_batch_age: Annotated[
        str | None,
        typer.Option(
            help="--check: longest time without a relay batch while events wait, e.g. 5m."
        ),
    ] = "5m",
    run_dir: RunDirOption = None,
) -> None:
    """The parts `tidings run` supervises (up/down, restarts), events per status and per
    target, relay lag, last batch, the last errors.

    Reads only indexed, bounded parts of the log (never every row). With --check: exit 0
    when healthy, 1 with one line per problem (FAILED or PARKED events, lag or batch age
    over the thresholds, a part of `tidings run` down), 2 when the configuration or database
    cannot be read.
    """
    from tidings.db import make_engine
    from tidings.outbox.schema import ensure_schema
    from tidings.pipeline.standby import relay_lease_state
    from tidings.pipeline.status import health_problems, health_report
    from tidings.routing.table import current_routes

    cfg = load_or_exit(config)
    parts = parts_status(config, run_dir)
    lag_s = seconds_option(max_lag_seconds, "--max-lag-seconds")
    batch_s = seconds_option(max_batch_age, "--max-batch-age")
    engine = make_engine(cfg.database.url)
    try:  # an unreachable database: one line, exit 2 (cli.common)
        ensure_schema(engine)
        report = health_report(engine, current_routes(cfg, engine), errors=errors)
        relays = relay_lease_state(engine)
    finally:
        engine.dispose()
    lags = {} if parts is None else part_lags(cfg, report.lag_events)
    if parts is not None:
        for name, part in parts["parts"].items():
            part["lag"] = lags.get(name)
    if as_json:
        shown = report.as_json() | {"relay_lease": relays.as_json()}
        shown |= {} if parts is None else {"parts": parts}
        typer.echo(json.dumps(shown, indent=2))  # plain: rich would wrap
    elif not check:
        if parts is not None:
            print_parts(parts, lags)
        _print_status(report)
        _print_relays(relays)
    if check:
        problems = health_problems(
            report, max_lag=max_lag, max_lag_seconds=lag_s, max_batch_age_seconds=batch_s
        ) + ([] if parts is None else down_parts(parts))
        for problem in problems:
            console.print(problem, markup=False, soft_wrap=True)
        if problems:
            raise typer.Exit(1)
        if not as_json:
            console.print("healthy")


def _print_status(report: HealthReport) -> None:
    table = Table(title="not published, per status")
    for col in ("status", "events", "oldest"):
        table.add_column(col, justify="right" if col != "status" else "left")
    for name, count in sorted(report.counts.items()):
        table.add_row(name, str(count), f"{report.oldest_age_seconds.get(name, 0):.1f} s")
    console.print(table)
    targets = Table(title="events not yet confirmed, per target")
    for col in ("target", "pending", "held", "failed", "parked"):
        targets.add_column(col, justify="right" if col != "target" else "left")
    for name, f in sorted(report.targets.items()):
        targets.add_row(name, str(f.pending), str(f.held), str(f.failed), str(f.parked))
    console.print(targets)
    if report.unroutable_by_type:
        types = Table(title="unroutable, per type")
        types.add_column("event type")
        types.add_column("events", justify="right")
        for etype, count in sorted(report.unroutable_by_type.items()):
            types.add_row(Text(etype), str(count))
        console.print(types)
    batch = report.last_batch_age_seconds
    console.print(
        f"relay: newest seq {report.newest_seq}, relayed up to "
        f"{'nothing yet' if report.relayed_seq is None else report.relayed_seq}, "
        f"lag {report.lag_events} events ({report.lag_seconds:.1f} s); last batch "
        + (f"{batch:.1f} s ago" if batch is not None else "never"),
        markup=False,
        soft_wrap=True,
    )
    console.print(f"keys held behind a FAILED event: {report.keys_held_behind_failed}")
    age = report.oldest_open_age_seconds
    console.print(f"oldest open event: {age:.1f} s old" if age is not None else "no open events")
    for e in report.last_errors:
        console.print(
            f"seq {e.seq} {e.event_type} ({e.updated_at}): {e.error}", markup=False, style="red"
        )


def _print_relays(relays: RelayLeaseState) -> None:
    if relays.active is None:
        line = "relay lease: free (no relay active)"
    else:
        line = f"relay lease: held by {relays.active} (expires in {relays.expires_in_s} s)"
    if relays.standby:
        line += f"; standing by: {', '.join(relays.standby)}"
    console.print(line, markup=False, soft_wrap=True)


@routes_app.command("list")
def routes_list(config: ConfigOption = None) -> None:
    """Show the routes in force (configuration merged with the database table)."""
    from tidings.db import make_engine
    from tidings.outbox.schema import ensure_schema
    from tidings.routing.table import current_routes

    cfg = load_or_exit(config)
    engine = make_engine(cfg.database.url)
    ensure_schema(engine)
    for event_type, targets in sorted(current_routes(cfg, engine).by_type.items()):
        console.print(f"{event_type} -> {', '.join(targets)}", markup=False)


@routes_app.command("add")
def routes_add(
    event_type: str,
    target: str,
    config: ConfigOption = None,
    redrive: Annotated[
        bool, typer.Option(help="Also resubmit the UNROUTABLE events this route now matches.")
    ] = False,
) -> None:
    """Route EVENT_TYPE (a type, a prefix ending in '*', or '*') to TARGET from the next
    micro-batch on."""
    from tidings.db import make_engine
    from tidings.events.outbox import EventStatus
    from tidings.outbox.incomplete import EventFilter, IncompleteEvents
    from tidings.outbox.schema import ensure_schema
    from tidings.routing.table import add_route, current_routes

    cfg = load_or_exit(config)
    require_target(cfg, target)
    engine = make_engine(cfg.database.url)
    ensure_schema(engine)
    try:
        add_route(engine, event_type, target)
    except TidingsError as exc:
        fail(f"cannot route it: {exc}")
    console.print(f"{event_type} -> {target} added", markup=False)
    events = IncompleteEvents(engine, current_routes(cfg, engine).targets_for)
    waiting = EventFilter(statuses=frozenset({EventStatus.UNROUTABLE}), event_type=event_type)
    if redrive:
        console.print(f"re-driven: {events.resubmit(waiting)} unroutable event(s)")
    elif waiting_count := events.count(waiting):
        console.print(
            f"{waiting_count} UNROUTABLE event(s) match it; send them with: tidings events "
            f"resubmit --status UNROUTABLE --type {event_type!r} (or routes add --redrive)",
            markup=False,
        )


@routes_app.command("remove")
def routes_remove(event_type: str, target: str, config: ConfigOption = None) -> None:
    """Stop routing EVENT_TYPE to TARGET (routes in the database table only)."""
    from tidings.db import make_engine
    from tidings.outbox.schema import ensure_schema
    from tidings.routing.table import remove_route

    cfg = load_or_exit(config)
    engine = make_engine(cfg.database.url)
    ensure_schema(engine)
    if not remove_route(engine, event_type, target):
        err.print(f"no route {event_type} -> {target} in the table", markup=False)
        raise typer.Exit(1)
    console.print(f"{event_type} -> {target} removed", markup=False)
