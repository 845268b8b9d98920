"""The rules of a stream's types map: FTN18 names, patterns, no two names for one event."""

from __future__ import annotations

import pytest

from tidings.config.stream_types import patterns_overlap, type_patterns
from tidings.errors import ConfigError


def test_patterns_overlap_follows_hat_matching() -> None:
    assert patterns_overlap(("a", "b"), ("a", "b"))
    assert patterns_overlap(("a", "?"), ("a", "b"))
    assert patterns_overlap(("a", "*"), ("a",))  # '*' matches zero segments
    assert patterns_overlap(("?", "*"), ("x", "y", "z"))
    assert not patterns_overlap(("a", "b"), ("a", "c"))
    assert not patterns_overlap(("a",), ("a", "b"))
    assert not patterns_overlap(("a", "?"), ("a", "b", "c"))


@pytest.mark.parametrize(
    ("types", "message"),
    [
        ({"order": ["a"]}, "cannot be an FTN18 type"),
        ({"ORDER_CREATED_LONGER": ["a"]}, "cannot be an FTN18 type"),
        ({"A": ["x", "*"], "B": ["x", "y"]}, "types A and B collide"),
        ({"A": [["x", "?"]], "B": ["x", "y"]}, "collide"),
        ({"A": []}, "not an event type pattern"),
        ({"A": ["*", "x"]}, "only as the last segment"),
        ({"A": [""]}, "not an event type pattern"),
        ({}, "at least one type"),
    ],
)
def test_type_map_refuses_names_that_cannot_map_and_collisions(types: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        type_patterns(types)
