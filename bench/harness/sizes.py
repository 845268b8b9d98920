"""The two sizes every benchmark runs at, and the command line that chooses one.

A full run takes the sizes its figures are recorded at; ``--quick`` takes smaller ones, to
check that the benchmark runs (its figures are not comparable; ``--results`` then keeps its
report away from the recorded ones). A benchmark's sizes are a
frozen dataclass deriving from :class:`Sizes`, and a :class:`Scale` holds its two.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from bench.harness.paths import RESULTS


@dataclass(frozen=True)
class Sizes:
    """The base of a benchmark's sizes (events, runs, seconds: its fields); reports record
    them with :meth:`as_dict`."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


S = TypeVar("S")


@dataclass(frozen=True)
class Scale(Generic[S]):
    """A benchmark's full sizes and its ``--quick`` ones."""

    full: S
    quick: S

    def pick(self, quick: bool) -> S:
        return self.quick if quick else self.full


def mode(quick: bool) -> str:
    """``quick`` or ``full``, for progress lines."""
    return "quick" if quick else "full"


def arguments(module: str, doc: str | None, quick_help: str) -> argparse.ArgumentParser:
    """The command line of the benchmark run as ``python -m module``: its description is
    the first line of ``doc`` (the benchmark's docstring), and ``--quick`` picks the smaller
    sizes, ``--results`` where the report goes (``bench/results/`` by default)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {module}", description=(doc or "").splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="the folder to write the report into"
    )
    return parser
