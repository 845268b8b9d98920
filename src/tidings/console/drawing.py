"""Boxes of an intermediary's ``/status`` drawn over its world, as the rectangles of an
inline SVG (no chart library): the boxes it asks upstream for (its coverage) and, for a
tier member, each member's cells of responsibility.

Only the first two axes are drawn (a 3D world is seen from above); the SVG's y axis points
down, so the world's y is flipped. Every figure is a number the page prints, never text
from the intermediary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The drawing's width in SVG units; its height follows the world's aspect.
WIDTH = 300.0
#: The fills of the members' areas, in order of their names.
AREA_FILLS = ("#cfe3ff", "#ffe0b3", "#d7f2d0", "#f3d1f0", "#fff3a8", "#d6d6f5")


@dataclass(frozen=True)
class Rect:
    """One rectangle in SVG units, with its class and its title (what it is)."""

    x: float
    y: float
    width: float
    height: float
    kind: str
    title: str
    fill: str = "none"


@dataclass
class Drawing:
    """The world's frame and the rectangles over it."""

    width: float
    height: float
    rects: list[Rect] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)


def _box(box: Any) -> tuple[list[float], list[float]] | None:
    if not isinstance(box, Mapping):
        return None
    lo, hi = box.get("lo"), box.get("hi")
    if not (isinstance(lo, list) and isinstance(hi, list) and len(lo) >= 2 and len(hi) >= 2):
        return None
    try:
        return [float(v) for v in lo[:2]], [float(v) for v in hi[:2]]
    except (TypeError, ValueError):
        return None


def draw(status: Mapping[str, Any]) -> Drawing | None:
    """The drawing of ``status`` (an intermediary's ``/status``), or None when it has no
    two-dimensional world to draw on (an intermediary of event types and views only)."""
    responsibility = status.get("responsibility") or {}
    world = _box(status.get("world")) or _box(responsibility.get("world"))
    if world is None:
        return None
    (x0, y0), (x1, y1) = world
    if not (x1 > x0 and y1 > y0):
        return None
    scale = WIDTH / (x1 - x0)
    drawing = Drawing(WIDTH, round((y1 - y0) * scale, 2))

    def rects(boxes: Iterable[Any], kind: str, title: str, fill: str = "none") -> None:
        for box in boxes:
            found = _box(box)
            if found is None:
                continue
            (lx, ly), (hx, hy) = found
            drawing.rects.append(
                Rect(
                    round((lx - x0) * scale, 2),
                    round((y1 - hy) * scale, 2),
                    round((hx - lx) * scale, 2),
                    round((hy - ly) * scale, 2),
                    kind,
                    title,
                    fill,
                )
            )

    areas = responsibility.get("areas") or {}
    for n, (owner, cells) in enumerate(sorted(areas.items())):
        fill = AREA_FILLS[n % len(AREA_FILLS)]
        mine = " (this one)" if owner == responsibility.get("member") else ""
        rects(cells.get("boxes", []), "area", f"{owner}'s area{mine}", fill)
        drawing.legend.append((fill, f"{owner}{mine}"))
    rects((status.get("coverage") or {}).get("boxes", []), "coverage", "upstream coverage")
    return drawing
