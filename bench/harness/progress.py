"""Progress lines of a benchmark run, each stamped with the seconds since the run started,
so that a slow step stands out in the output and the reports can give the run's length."""

from __future__ import annotations

import time

_T0 = time.monotonic()


def runtime_s() -> float:
    """Seconds since the benchmark started (this module's import), for progress and reports."""
    return time.monotonic() - _T0


def say(message: str) -> None:
    """One progress line, stamped with the run's elapsed time so slow steps stand out."""
    print(f"[{runtime_s():7.1f}s] {message}", flush=True)
