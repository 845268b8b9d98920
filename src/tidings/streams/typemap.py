"""Which event server types a stream carries, and the FTN18 type name each one goes by.

FTN18 types are flat names (``^[A-Z_]{1,16}$``); server types are Hat's lists of segments.
A stream names each FTN18 type with one or more Hat patterns. The map is checked once, when
the configuration is loaded: a name that is not a valid FTN18 type, or two names whose
patterns could both match one event (which name would the event carry?), refuse to start.
An event then carries the name of the one entry whose patterns match it, and a consumer's
``want`` list becomes the patterns of the names it lists, so filtering stays in the store.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from tidings.errors import ConfigError
from tidings.events.matching import ANY_ONE, ANY_REST, QueryType, TypeMatcher
from tidings.events.model import EventType

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


class TypeMap:
    """A stream's FTN18 names and their patterns; see the module docstring."""

    def __init__(self, patterns: Mapping[str, tuple[QueryType, ...]]) -> None:
        self.patterns = dict(patterns)
        if not self.patterns:
            raise ConfigError("a stream must carry at least one type")
        for name, patterns in self.patterns.items():
            if not FTN18_TYPE.match(name):
                raise ConfigError(
                    f"type name {name!r} cannot be an FTN18 type: use 1 to 16 of A-Z and _"
                )
            if not patterns:
                raise ConfigError(f"type {name}: give at least one event type pattern")
        entries = [(name, p) for name, patterns in self.patterns.items() for p in patterns]
        for index, (name, pattern) in enumerate(entries):
            for other_name, other in entries[index + 1 :]:
                if other_name != name and patterns_overlap(pattern, other):
                    raise ConfigError(
                        f"types {name} and {other_name} collide: an event of type "
                        f"{_shown(pattern)} could also be {_shown(other)}; make the patterns "
                        "disjoint so that each event has one FTN18 type"
                    )
        self._matchers = {name: TypeMatcher(p) for name, p in self.patterns.items()}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.patterns)

    def all_patterns(self) -> list[QueryType]:
        """Every pattern the stream carries."""
        return [p for patterns in self.patterns.values() for p in patterns]

    def wanted_patterns(self, want: Sequence[str] | None) -> list[QueryType]:
        """The patterns of the names in ``want`` (``None``: all); unknown names select
        nothing, as FTN18 lets a generator skip what it does not produce."""
        if want is None:
            return self.all_patterns()
        return [p for name in dict.fromkeys(want) for p in self.patterns.get(name, ())]

    def name_of(self, event_type: EventType) -> str | None:
        """The FTN18 name of an event of ``event_type``; ``None`` if the stream omits it."""
        for name, matcher in self._matchers.items():
            if matcher.matches(event_type):
                return name
        return None

    def event_type_of(self, name: str) -> EventType | None:
        """The one server type ``addEvent`` stores an event of FTN18 type ``name`` as: the
        name's pattern, if it has exactly one and it has no wildcard; else ``None``."""
        patterns = self.patterns.get(name, ())
        if len(patterns) != 1 or any(s in (ANY_ONE, ANY_REST) for s in patterns[0]):
            return None
        return patterns[0] or None


def type_map_from_config(types: Mapping[str, Iterable[object]]) -> TypeMap:
    """Build a map from configuration: ``NAME: [seg, …]`` (one pattern) or
    ``NAME: [[seg, …], …]`` (several)."""
    built: dict[str, tuple[QueryType, ...]] = {}
    for name, value in types.items():
        items = list(value)
        nested = items and all(isinstance(item, list | tuple) for item in items)
        raw = items if nested else [items]
        patterns = []
        for pattern in raw:
            if not pattern or not all(isinstance(s, str) and s for s in pattern):
                raise ConfigError(
                    f"type {name}: {pattern!r} is not an event type pattern (a non-empty list "
                    "of non-empty strings, '?' for one segment, '*' last for the rest)"
                )
            if ANY_REST in pattern[:-1]:
                raise ConfigError(f"type {name}: '*' is allowed only as the last segment")
            patterns.append(tuple(pattern))
        built[name] = tuple(patterns)
    return TypeMap(built)


def _shown(pattern: QueryType) -> str:
    return "/".join(pattern)
