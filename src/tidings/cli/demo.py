"""``tidings demo``: the whole chain, or with ``--core`` the publishing core alone, on the
embedded default, ending in one verdict (exit 1 when it fails)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from tidings.cli.common import app, console

if TYPE_CHECKING:
    from tidings.demo import ChainResult, DemoResult


def _say(message: str) -> None:
    console.print(f"[dim]{message}[/dim]", highlight=False)


@app.command()
def demo(
    operations: Annotated[
        int, typer.Option(min=1, max=1_000_000, help="Domain operations to perform.")
    ] = 3000,
    rate: Annotated[
        float, typer.Option(min=1, max=100_000, help="Operations per second offered.")
    ] = 500,
    core: Annotated[
        bool, typer.Option("--core", help="Only the core: outbox, relay, embedded event store.")
    ] = False,
    workdir: Annotated[Path, typer.Option(help="Scratch directory (wiped).")] = Path(
        ".tidings/demo"
    ),
) -> None:
    """Run tidings end to end on the embedded default and report its verdict: a bank's
    outbox, the Spark relay, the event server with a module, FTN18 consumers and an
    intermediary's subscribers (--core: outbox, relay and embedded store only)."""
    from tidings.demo import run_chain_demo, run_demo

    if core:
        _core_report(run_demo(workdir, operations, rate, say=_say))
    else:
        _chain_report(run_chain_demo(workdir, operations, rate, say=_say))


def _chain_report(result: ChainResult) -> None:
    from tidings.demo import percentile

    verdict = result.verdict
    table = Table(title="reliable consumers (FTN18)")
    for column in (
        "consumer",
        "received",
        "missing",
        "extra",
        "duplicates",
        "out of order",
    ):
        table.add_column(column, justify="left" if column == "consumer" else "right")
    for c in verdict.consumers:
        table.add_row(
            c.component, str(c.received), str(c.missing), str(c.extra), str(c.duplicates),
            str(c.out_of_order),
        )  # fmt: skip
    console.print(table)
    pushed = verdict.consumers[0].latencies_ms
    subscribed = verdict.subscriber_latencies_ms
    console.print(
        f"committed: {verdict.committed} events the stream carries "
        f"({verdict.rolled_back} transactions rolled back: their events appear nowhere)\n"
        f"live consumer: {verdict.live_received} events (no cursor)\n"
        f"event store: each relayed event stored once: {'yes' if verdict.stored_once else 'NO'}"
        f"; module alerts: {verdict.alerts_stored} for {verdict.alerts_expected} large "
        f"withdrawals (a subscriber saw {verdict.alerts_seen_by_subscriber})\n"
        f"intermediary: SQL views equal the account table ({verdict.view_rows} rows): "
        f"{'yes' if verdict.views_equal else 'NO'}\n"
        f"latency commit -> reliable consumer: p50 {percentile(pushed, 50):.0f} ms, "
        f"p99 {percentile(pushed, 99):.0f} ms; commit -> subscriber: p50 "
        f"{percentile(subscribed, 50):.0f} ms, p99 {percentile(subscribed, 99):.0f} ms\n"
        f"wall time {result.seconds:.1f} s; the deployment: {result.deployment.path}",
        highlight=False,
    )
    if verdict.ok:
        console.print(
            "[bold green]OK: every committed event reached each reliable consumer exactly once "
            "after de-duplication, in key order; the SQL views equal the source table; the "
            "module saw every relayed event."
        )
        return
    for problem in verdict.problems:
        console.print(f"[bold red]FAILED: {problem}")
    raise typer.Exit(1)


def _core_report(result: DemoResult) -> None:
    from tidings.demo import percentile

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
