"""Where things are: the checkout the benchmarks run from and measure, and the folder their
reports go to."""

from __future__ import annotations

from pathlib import Path

#: The checkout's root (``bench/`` is in it).
REPO = Path(__file__).resolve().parents[2]
#: Where each benchmark writes ``<name>.json`` and ``<name>.md``.
RESULTS = REPO / "bench" / "results"
