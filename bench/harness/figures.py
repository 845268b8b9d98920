"""One percentile and one way of judging a figure against its goal, for every benchmark."""

from __future__ import annotations

from typing import Any


def goals_met(figures: dict[str, Any], goals: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Whether each goal is met: ``{"max": x}``, ``{"min": x}``, or ``{"min_ratio": r,
    "of": other}`` (at least ``r`` times figure ``other`` of the same run); a figure that is
    missing meets nothing."""
    met: dict[str, bool] = {}
    for name, goal in goals.items():
        value = figures.get(name)
        if value is None:
            met[name] = False
        elif "max" in goal:
            met[name] = value <= goal["max"]
        elif "min" in goal:
            met[name] = value >= goal["min"]
        else:
            other = figures.get(goal["of"])
            met[name] = other is not None and value >= goal["min_ratio"] * other
    return met


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between the closest ranks.

    This is numpy's default (``method="linear"``): position ``(n - 1) * q / 100`` in the
    sorted values, so p50 of an even count is the mean of the middle two and p100 the maximum.
    """
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
