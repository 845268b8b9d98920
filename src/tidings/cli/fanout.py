"""``tidings fanout-demo``: the intermediaries' fan-out, measured and plotted."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tidings.cli.common import app, console


@app.command("fanout-demo")
def fanout_demo(
    subscribers: Annotated[
        int, typer.Option(min=1, help="Subscribers (WebSocket connections).")
    ] = 300,
    entities: Annotated[
        int, typer.Option(min=1, help="Moving agents the publisher simulates.")
    ] = 20_000,
    intermediaries: Annotated[int, typer.Option(min=1, help="Intermediaries in the tier.")] = 3,
    processes: Annotated[int, typer.Option(min=1, help="Subscriber processes.")] = 4,
    duration: Annotated[float, typer.Option(min=0.5, help="Seconds measured.")] = 5.0,
    warmup: Annotated[float, typer.Option(min=0, help="Seconds before measuring.")] = 2.0,
    rate: Annotated[
        float, typer.Option(min=0.1, help="Updates per second each subscriber asks.")
    ] = 10.0,
    png: Annotated[Path, typer.Option(help="Where to write the plot.")] = Path("fanout-demo.png"),
) -> None:
    """Run a simulation publisher, intermediaries and many subscriber processes for a few
    seconds; print the delivered update rates, the staleness and the upstream bandwidth
    against every subscriber connecting to the publisher directly; plot them to a PNG."""
    import asyncio

    from tidings.intermediary.measurement.demo import plot, summary
    from tidings.intermediary.measurement.fanout import FanoutConfig, run_fanout

    config = FanoutConfig(
        subscribers=subscribers,
        entities=entities,
        intermediaries=intermediaries,
        processes=min(processes, subscribers),
        duration_s=duration,
        warmup_s=warmup,
        rate_hz=rate,
    )
    console.print(f"[dim]running {subscribers} subscribers for {warmup + duration:g} s...[/dim]")
    result = asyncio.run(run_fanout(config))
    for line in summary(result):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(f"plot: {plot(result, png)}", markup=False, highlight=False, soft_wrap=True)
