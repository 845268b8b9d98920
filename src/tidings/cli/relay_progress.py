"""What ``tidings relay`` shows while it runs and when it ends, and how it stops on signals.

While it runs: on a terminal, a live status line (rich) with what the run published and the
relay's lag, refreshed every tick; otherwise (a log file, journald, a container's stdout) a
plain line every :data:`PLAIN_EVERY_S` seconds when something changed. When it ends: one
line with the events read, published per target, failed, held, unroutable and the time.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from rich.status import Status

from tidings.cli.common import console

if TYPE_CHECKING:
    from tidings.pipeline.metrics import BatchLogFollower
    from tidings.pipeline.publishing.outcome import Summary

#: Seconds between two plain progress lines when stdout is not a terminal.
PLAIN_EVERY_S = 30.0


def run_summary(total: Summary, seconds: float) -> str:
    """``7 events read, 5 published (store 5), 0 failed, 0 held, 2 unroutable in 3.1 s``."""
    per_target = ", ".join(
        f"{target} {sum(by_type.values())}"
        for target, by_type in sorted(total.published_to.items())
    )
    published = f"{total.published} published" + (f" ({per_target})" if per_target else "")
    return (
        f"{total.events} events read, {published}, {total.failed} failed, {total.held} held, "
        f"{total.unroutable} unroutable in {seconds:.1f} s"
    )


class RelayProgress:
    """Follows the batch log on every relay tick and shows the run's progress."""

    def __init__(self, follower: BatchLogFollower, started: float) -> None:
        self.follower = follower
        self.started = started
        self._live: Status | None = None
        self._last_plain = time.monotonic()
        self._last_text = ""

    def __enter__(self) -> RelayProgress:
        if console.is_terminal:
            self._live = console.status("relay: starting ...")
            self._live.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.stop()

    def tick(self) -> None:
        self.follower.poll()
        total, health = self.follower.total, self.follower.health
        text = f"relay: {total.published} published, {total.failed} failed, {total.held} held"
        if health is not None:
            text += f"; lag {health.lag_events} events ({health.lag_seconds:.1f} s)"
        if self._live is not None:
            self._live.update(text)
        elif text != self._last_text and time.monotonic() - self._last_plain >= PLAIN_EVERY_S:
            console.print(text, markup=False, soft_wrap=True)
            self._last_plain, self._last_text = time.monotonic(), text


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while the block runs (the previous handlers are
    restored after it). A second SIGINT raises KeyboardInterrupt as usual, for a relay that
    does not stop."""
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
