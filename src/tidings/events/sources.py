"""Who registered an event: its source (Hat's ``Source``), part of the one event model.

Every registration on an event server is made on behalf of a source, as in hat-event 0.8.5:
an Eventer connection (its id, from 1 per server run), the Syncer (id 0), the engine itself
(id 0: its STARTED and STOPPED events) or an engine module (its index in
``engine.modules``). tidings adds two producers Hat does not have: the relay's
``event_store`` target, which registers through an engine of its own, and the FTN18 streams.

Modules receive the source of each event they process (a module's additions carry the
module's source), and the store records it, with an optional ``name`` that tells an operator
more than a number (the Eventer client's identity, the module's Python path). The wire to
hat clients never carries it: hat-event 0.8.5's Eventer protocol has no field for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tidings.errors import EngineError


class SourceKind(StrEnum):
    """The kinds of source: Hat's four (``SourceType``), then tidings' own two."""

    EVENTER = "eventer"
    SYNCER = "syncer"
    ENGINE = "engine"
    MODULE = "module"
    RELAY = "relay"
    STREAMS = "streams"


#: The kinds hat-event 0.8.5 has; the others appear to hat modules as an Eventer with id 0
#: (no connection has that id): a producer from outside, as a client would be.
HAT_KINDS = frozenset({SourceKind.EVENTER, SourceKind.SYNCER, SourceKind.ENGINE, SourceKind.MODULE})


@dataclass(frozen=True, slots=True)
class Source:
    """One source: its kind, its id among that kind, and a name an operator recognises."""

    kind: SourceKind
    id: int = 0
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, SourceKind):
            raise EngineError(f"source: kind must be a SourceKind, not {self.kind!r}")
        if isinstance(self.id, bool) or not isinstance(self.id, int) or self.id < 0:
            raise EngineError(f"source: id must be an int >= 0, not {self.id!r}")
        if self.name is not None and not isinstance(self.name, str):
            raise EngineError(f"source: name must be a str or None, not {self.name!r}")

    def __str__(self) -> str:
        text = f"{self.kind.value} {self.id}"
        return text if self.name is None else f"{text} ({self.name})"


#: The engine's own registrations (STARTED, STOPPED), and a direct caller of the engine.
ENGINE_SOURCE = Source(SourceKind.ENGINE)
#: The Syncer's status events (Hat: ``Source(SYNCER, 0)``).
SYNCER_SOURCE = Source(SourceKind.SYNCER)
#: The relay's ``event_store`` target.
RELAY_SOURCE = Source(SourceKind.RELAY)
#: The FTN18 streams (their consumers' bookkeeping and the events their clients add).
STREAMS_SOURCE = Source(SourceKind.STREAMS)


def eventer_source(connection_id: int, name: str | None = None) -> Source:
    """The source of an Eventer connection (``connection_id`` from 1), named by its
    client's identity when it has one."""
    return Source(SourceKind.EVENTER, connection_id, name)


def module_source(index: int, name: str) -> Source:
    """The source of the engine module at ``index`` of ``engine.modules`` (Hat numbers
    modules so, from 0), named by its Python module path."""
    return Source(SourceKind.MODULE, index, name)
