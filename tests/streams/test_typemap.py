"""A stream's type map: the FTN18 name of an event, the patterns of a want list."""

from __future__ import annotations

from tests.support.stream_helpers import TYPES
from tidings.streams.typemap import type_map_from_config


def test_type_map_names_events_and_resolves_want() -> None:
    types = type_map_from_config(TYPES)
    assert types.name_of(("orders", "created")) == "ORDER"
    assert types.name_of(("audit", "x", "y")) == "AUDIT"
    assert types.name_of(("orders", "deleted")) is None
    assert types.wanted_patterns(["PAY", "NOPE"]) == [("payments", "done")]
    assert types.wanted_patterns([]) == []
    assert len(types.wanted_patterns(None)) == 3
    assert types.event_type_of("ORDER") == ("orders", "created")
    assert types.event_type_of("AUDIT") is None  # a pattern cannot be generated
