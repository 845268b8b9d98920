"""The rules of a stream's ``types`` map: FTN18 type names, each naming event type patterns.

FTN18 types are flat names (``^[A-Z_]{1,16}$``); server types are Hat's lists of segments.
A stream names each FTN18 type with one or more Hat patterns. The map is checked once, when
the configuration is loaded: a name that is not a valid FTN18 type, or two names whose
patterns could both match one event (which name would the event carry?), refuse to start.
The streams build their runtime map from the checked patterns
(:class:`tidings.streams.typemap.TypeMap`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TypeGuard

from tidings.errors import ConfigError
from tidings.events.matching import ANY_ONE, ANY_REST, QueryType

#: FTN18's EventType.
FTN18_TYPE = re.compile(r"^[A-Z_]{1,16}$")


def patterns_overlap(a: QueryType, b: QueryType) -> bool:
    """Tell whether some event type matches both patterns (``*`` is only ever last)."""
    for index in range(max(len(a), len(b))):
        left = a[index] if index < len(a) else None
        right = b[index] if index < len(b) else None
        if left == ANY_REST or right == ANY_REST:
            return True
        if left is None or right is None:
            return False
        if ANY_ONE not in (left, right) and left != right:
            return False
    return True


def check_type_patterns(patterns: Mapping[str, tuple[QueryType, ...]]) -> None:
    """Refuse (ConfigError) a map that carries no type, a name that is not an FTN18 type, a
    name without patterns, or two names whose patterns could match one event."""
    if not patterns:
        raise ConfigError("a stream must carry at least one type")
    for name, named in patterns.items():
        if not FTN18_TYPE.match(name):
            raise ConfigError(
                f"type name {name!r} cannot be an FTN18 type: use 1 to 16 of A-Z and _"
            )
        if not named:
            raise ConfigError(f"type {name}: give at least one event type pattern")
    entries = [(name, p) for name, named in patterns.items() for p in named]
    for index, (name, pattern) in enumerate(entries):
        for other_name, other in entries[index + 1 :]:
            if other_name != name and patterns_overlap(pattern, other):
                raise ConfigError(
                    f"types {name} and {other_name} collide: an event of type "
                    f"{_shown(pattern)} could also be {_shown(other)}; make the patterns "
                    "disjoint so that each event has one FTN18 type"
                )


def generated_type(patterns: tuple[QueryType, ...]) -> QueryType | None:
    """The one server type ``addEvent`` stores an event of an FTN18 type with these
    patterns as: its pattern, if it has exactly one and that has no wildcard; else None
    (the stream cannot generate that type)."""
    if len(patterns) != 1 or any(s in (ANY_ONE, ANY_REST) for s in patterns[0]):
        return None
    return patterns[0] or None


def type_patterns(types: Mapping[str, Iterable[object]]) -> dict[str, tuple[QueryType, ...]]:
    """The checked patterns of a configured map: ``NAME: [seg, …]`` (one pattern) or
    ``NAME: [[seg, …], …]`` (several)."""
    built: dict[str, tuple[QueryType, ...]] = {}
    for name, value in types.items():
        items = list(value)
        nested = items and all(isinstance(item, list | tuple) for item in items)
        raw = items if nested else [items]
        patterns: list[QueryType] = []
        for pattern in raw:
            if not _is_pattern(pattern):
                raise ConfigError(
                    f"type {name}: {pattern!r} is not an event type pattern (a non-empty list "
                    "of non-empty strings, '?' for one segment, '*' last for the rest)"
                )
            if ANY_REST in pattern[:-1]:
                raise ConfigError(f"type {name}: '*' is allowed only as the last segment")
            patterns.append(tuple(pattern))
        built[name] = tuple(patterns)
    check_type_patterns(built)
    return built


def _is_pattern(value: object) -> TypeGuard[list[str] | tuple[str, ...]]:
    return (
        isinstance(value, list | tuple)
        and bool(value)
        and all(isinstance(s, str) and s for s in value)
    )


def _shown(pattern: QueryType) -> str:
    return "/".join(pattern)
