"""Targets made for one test and closed after it: each kind's ``make_target`` fixture is
:func:`target_maker` with that kind's defaults."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tidings.targets.base import Target

T = TypeVar("T", bound=Target)


def target_maker(
    build: Callable[[dict[str, Any]], T], defaults: dict[str, Any]
) -> Iterator[Callable[..., T]]:
    """Yields ``make(**overrides)``: a target ``build`` makes of ``defaults`` updated by
    ``overrides``; closes every target made once resumed (a fixture's teardown):
    ``yield from target_maker(...)``."""
    built: list[T] = []

    def make(**overrides: Any) -> T:
        target = build({**defaults, **overrides})
        built.append(target)
        return target

    yield make
    for target in built:
        target.close()
