"""What one consumer is sent: the FTN18 types it reads and, for some of them, a condition
on the events' data.

A selection is the consumer's ``want`` narrowed by its user's permissions
(:mod:`.access`). Every read for the consumer applies it, from the feed or from the store,
before anything is encoded into a reply or a push: an event it does not admit is never
sent, and counts as delivered, as one the ``want`` skips does (FTN18 2.2.3), so the
consumer's position moves past it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from tidings.streams.protocol.encoding import WireEvent

#: A condition on an event's FTN18 ``data``.
DataCondition = Callable[[Any], bool]


@dataclass(frozen=True)
class Selection:
    """``names``: the FTN18 types read (None: every type the stream carries); ``filters``:
    per type name, the condition its events' data must meet (a name without one: every
    event of it)."""

    names: frozenset[str] | None = None
    filters: Mapping[str, DataCondition] = field(default_factory=dict)

    @property
    def want(self) -> list[str] | None:
        """The type names to read, as a ``want`` list (None: all), for the store's query."""
        return None if self.names is None else sorted(self.names)

    def admits(self, event: WireEvent) -> bool:
        """Whether the consumer is sent ``event``. The data is decoded only for a type
        with a filter; what the filter sees is the ``data`` the consumer would get."""
        if self.names is not None and event.name not in self.names:
            return False
        condition = self.filters.get(event.name)
        return condition is None or condition(orjson.loads(event.encoded)["data"])


#: Every event the stream carries: a ``want`` of null from a user without restrictions.
EVERYTHING = Selection()
