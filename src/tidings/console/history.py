"""A short history of the outbox's figures, sampled by the console, and its plots.

Every ``sample_every`` the console takes a :class:`~tidings.pipeline.status.HealthReport`
(indexed reads only; never a scan of the log) and keeps a few of its figures for
``history``: the newest sequence, the relay's watermark, the relay's lag and the open and
FAILED counts. Throughput is the watermark's rise between two samples. The plots are inline
SVG polylines drawn here: a few dozen points need no chart library.
"""

from __future__ import annotations

import html
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """The figures of one moment (``at``: epoch seconds)."""

    at: float
    newest_seq: int
    relayed_seq: int
    lag_events: int
    lag_seconds: float
    open_events: int
    failed: int


class History:
    """The samples of the last ``keep_s`` seconds, oldest first."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._samples: deque[Sample] = deque()

    def add(self, sample: Sample) -> None:
        self._samples.append(sample)
        while self._samples and sample.at - self._samples[0].at > self.keep_s:
            self._samples.popleft()

    @property
    def samples(self) -> list[Sample]:
        return list(self._samples)

    def throughput(self) -> list[tuple[float, float]]:
        """Events relayed per second between consecutive samples, at the later one."""
        points = []
        pairs = zip(self._samples, list(self._samples)[1:], strict=False)
        for before, after in pairs:
            elapsed = after.at - before.at
            if elapsed > 0:
                rise = max(0, after.relayed_seq - before.relayed_seq)
                points.append((after.at, rise / elapsed))
        return points

    def series(self, name: str) -> list[tuple[float, float]]:
        """One figure of every sample, as (time, value)."""
        return [(s.at, float(getattr(s, name))) for s in self._samples]


def sparkline(points: list[tuple[float, float]], label: str, unit: str) -> str:
    """A small SVG plot of ``points`` with its label and the newest and largest values."""
    width, height, pad = 300, 60, 2
    title = html.escape(label)
    if len(points) < 2:
        return (
            f'<svg class="plot" viewBox="0 0 {width} {height}" role="img" aria-label="{title}">'
            f'<text x="4" y="34">{title}: collecting samples…</text></svg>'
        )
    first, last = points[0][0], points[-1][0]
    top = max(v for _, v in points) or 1.0
    span = (last - first) or 1.0
    coordinates = " ".join(
        f"{pad + (t - first) / span * (width - 2 * pad):.1f},"
        f"{height - pad - v / top * (height - 20):.1f}"
        for t, v in points
    )
    newest = points[-1][1]
    return (
        f'<svg class="plot" viewBox="0 0 {width} {height}" role="img" aria-label="{title}">'
        f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{coordinates}"/>'
        f'<text x="4" y="12">{title}: {newest:,.1f} {html.escape(unit)} '
        f"(max {top:,.1f})</text></svg>"
    )
