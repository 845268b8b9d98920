"""Targets made for one test and closed after it (each kind's ``make_target`` fixture is
:func:`target_maker` with that kind's defaults), and a target's configuration validated as
a file's (:func:`target_config`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tidings.config import load_config, load_config_file
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


def target_config(name: str, entry: dict[str, Any], directory: Path | None = None) -> Any:
    """``entry`` validated as the configuration's target ``name``; read from a file written
    in ``directory`` if given (so that relative paths are relative to it)."""
    data = {"targets": {name: entry}}
    if directory is None:
        return load_config(data).targets[name]
    path = directory / "tidings.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config_file(path).targets[name]
