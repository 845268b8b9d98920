"""Type patterns met with each other (what access control by type stands on): the
intersection of two patterns and a request narrowed to a grant, held against brute force
over every event type of a small alphabet."""

from __future__ import annotations

import itertools

import pytest

from tidings.events.matching import QueryType, intersect, matches, narrow

#: Every event type of 1 to 3 segments over two names: enough to tell patterns apart.
TYPES = [t for n in range(1, 4) for t in itertools.product("ab", repeat=n)]
#: Every pattern of up to 3 segments over the names and ``?``, with or without a final ``*``.
PATTERNS: list[QueryType] = [
    (*body, *tail)
    for n in range(0, 4)
    for body in itertools.product(["a", "b", "?"], repeat=n)
    for tail in ((), ("*",))
]


def selected(pattern: QueryType | None) -> set[tuple[str, ...]]:
    return set() if pattern is None else {t for t in TYPES if matches(t, pattern)}


def test_the_intersection_matches_exactly_what_both_patterns_match() -> None:
    for a, b in itertools.product(PATTERNS, repeat=2):
        assert selected(intersect(a, b)) == selected(a) & selected(b), (a, b)


@pytest.mark.parametrize(
    ("requested", "granted", "kept", "refused"),
    [
        ([("*",)], [("orders", "*")], [("orders", "*")], [("*",)]),
        ([("orders", "x")], [("orders", "*")], [("orders", "x")], []),
        ([("orders", "?")], [("orders", "*"), ("?", "?")], [("orders", "?")], []),
        ([("users", "*")], [("orders", "*")], [], [("users", "*")]),
        ([("a", "*")], [("a", "b"), ("a", "c", "*")], [("a", "b"), ("a", "c", "*")], [("a", "*")]),
        ([], [("*",)], [], []),
    ],
)
def test_a_request_is_narrowed_to_its_grant_and_the_rest_named(
    requested: list[QueryType],
    granted: list[QueryType],
    kept: list[QueryType],
    refused: list[QueryType],
) -> None:
    assert narrow(requested, granted) == (kept, refused)


def test_narrowing_never_lets_through_what_the_grant_does_not_cover() -> None:
    grants = [[("a", "*")], [("?", "b")], [("b",), ("a", "a", "*")], []]
    for granted in grants:
        allowed = set().union(*(selected(g) for g in granted))
        for requested in PATTERNS:
            kept, refused = narrow([requested], granted)
            got = set().union(*(selected(k) for k in kept))
            assert got == selected(requested) & allowed
            if selected(requested):  # () selects nothing: refused or not, nothing is shown
                assert bool(refused) == (not selected(requested) <= allowed)
