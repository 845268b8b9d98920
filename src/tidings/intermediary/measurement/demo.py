"""``tidings fanout-demo``: a simulation, several intermediaries and many subscribers for a
few seconds, its figures printed and plotted.

The run is :func:`.fanout.run_fanout`, the benchmark's own measuring code; this module only
says what it measured, in words and in a PNG (matplotlib, drawn off-screen): the delivered
update rate against what the subscribers asked for, the staleness distribution, and the
upstream bandwidth through the tier against every subscriber connecting to the publisher
directly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tidings.intermediary.measurement.fanout import FanoutConfig, FanoutResult


def summary(result: FanoutResult) -> list[str]:
    """The figures, one line each, as the demo prints them."""
    c = result.config
    asked = c.subscribers * c.rate_hz
    return [
        f"{c.subscribers} subscribers in {c.processes} processes, {c.intermediaries} "
        f"intermediaries, {c.entities} agents at {c.tick_hz:g} Hz, {result.window_s:.1f} s "
        "measured",
        f"delivered updates: {result.delivered_updates_s:,.0f}/s of {asked:,.0f}/s asked; "
        f"worst subscriber {result.min_rate_fraction:.0%} of its rate, mean "
        f"{result.mean_rate_fraction:.0%}",
        f"staleness (publisher tick -> receipt): p50 {result.staleness_p50_ms:.0f} ms, "
        f"p99 {result.staleness_p99_ms:.0f} ms",
        f"upstream: {result.upstream_bytes_s / 1e6:.2f} MB/s through the intermediaries vs "
        f"{result.direct_bytes_s / 1e6:.2f} MB/s with every subscriber on the publisher "
        f"(ratio {result.upstream_ratio_vs_direct:.3f})",
        f"memory: {result.memory_per_subscriber_kib:.1f} KiB per subscriber; "
        f"disconnected: {result.disconnected}",
    ]


def plot(result: FanoutResult, path: Path) -> Path:
    """Draw the figures into a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    c = result.config
    fig, (rate, stale, upstream) = plt.subplots(1, 3, figsize=(13, 4.2))
    rate.bar(
        ["asked", "delivered"],
        [c.subscribers * c.rate_hz, result.delivered_updates_s],
        color=["#bbbbbb", "#2b7bb9"],
    )
    rate.set_title("updates per second")
    if result.staleness_ms:
        stale.hist(np.asarray(result.staleness_ms), bins=50, color="#2b7bb9")
    for value, label in ((result.staleness_p50_ms, "p50"), (result.staleness_p99_ms, "p99")):
        if np.isfinite(value):
            stale.axvline(value, color="#d7301f", linestyle="--")
            stale.text(value, stale.get_ylim()[1] * 0.9, f" {label} {value:.0f} ms")
    stale.set_title("staleness: publisher tick → receipt")
    stale.set_xlabel("ms")
    upstream.bar(
        ["through intermediaries", "direct to publisher"],
        [result.upstream_bytes_s / 1e6, result.direct_bytes_s / 1e6],
        color=["#2b7bb9", "#bbbbbb"],
    )
    upstream.set_title(f"publisher upstream MB/s (ratio {result.upstream_ratio_vs_direct:.3f})")
    fig.suptitle(
        f"tidings fan-out: {c.subscribers} subscribers, {c.intermediaries} intermediaries, "
        f"{c.entities} agents at {c.tick_hz:g} Hz"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return path


__all__ = ["FanoutConfig", "plot", "summary"]
