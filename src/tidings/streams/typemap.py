"""Which event server types a stream carries, and the FTN18 type name each one goes by.

FTN18 types are flat names; server types are Hat's lists of segments. A stream names each
FTN18 type with one or more Hat patterns, checked when the configuration is loaded
(:mod:`tidings.config.stream_types`: valid FTN18 names, no two names matching one event).
An event then carries the name of the one entry whose patterns match it, and a consumer's
``want`` list becomes the patterns of the names it lists, so filtering stays in the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tidings.config.stream_types import check_type_patterns, generated_type, type_patterns
from tidings.events.matching import QueryType, TypeMatcher
from tidings.events.model import EventType
from tidings.events.validation import RESERVED_CONSUMER_TYPE

#: The type prefix of the servers' consumer events (:mod:`.consumers.replication`):
#: reserved, no stream carries them and no client may register them.
CONSUMER_TYPE: EventType = RESERVED_CONSUMER_TYPE


def is_consumer_type(event_type: EventType) -> bool:
    """Whether ``event_type`` is a consumer event's."""
    return event_type[: len(CONSUMER_TYPE)] == CONSUMER_TYPE


class TypeMap:
    """A stream's FTN18 names and their patterns; see the module docstring."""

    def __init__(self, patterns: Mapping[str, tuple[QueryType, ...]]) -> None:
        check_type_patterns(patterns)
        self.patterns = dict(patterns)
        self._matchers = {name: TypeMatcher(p) for name, p in self.patterns.items()}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.patterns)

    def all_patterns(self) -> list[QueryType]:
        """Every pattern the stream carries."""
        return [p for patterns in self.patterns.values() for p in patterns]

    def wanted_patterns(self, want: Sequence[str] | None) -> list[QueryType]:
        """The patterns of the names in ``want`` (``None``: all); unknown names select
        nothing (the stream service refuses a ``want`` naming them before it reads)."""
        if want is None:
            return self.all_patterns()
        return [p for name in dict.fromkeys(want) for p in self.patterns.get(name, ())]

    def carries(self, event_type: EventType) -> bool:
        """Whether the stream sends events of ``event_type`` (:meth:`name_of` names it)."""
        return self.name_of(event_type) is not None

    def name_of(self, event_type: EventType) -> str | None:
        """The FTN18 name of an event of ``event_type``; ``None`` if the stream omits it.
        No stream carries the servers' own consumer events, whatever its patterns
        (:mod:`tidings.streams.consumers.replication`)."""
        if is_consumer_type(event_type):
            return None
        for name, matcher in self._matchers.items():
            if matcher.matches(event_type):
                return name
        return None

    def event_type_of(self, name: str) -> EventType | None:
        """The one server type ``addEvent`` stores an event of FTN18 type ``name`` as: the
        name's pattern, if it has exactly one and it has no wildcard; else ``None``."""
        return generated_type(self.patterns.get(name, ()))


def type_map_from_config(types: Mapping[str, Iterable[object]]) -> TypeMap:
    """Build a map from configuration: ``NAME: [seg, …]`` (one pattern) or
    ``NAME: [[seg, …], …]`` (several)."""
    return TypeMap(type_patterns(types))
