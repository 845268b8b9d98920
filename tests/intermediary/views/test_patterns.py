"""Coverage of event-type patterns, checked against brute force over a small alphabet.

Brute force: every type over the patterns' literals plus one literal none of them names, of
every length up to one past the longest pattern. A type longer than every pattern is matched
only through ``*`` and only by its first segments, and a value no pattern names is matched
only by ``?``/``*``, so these types decide coverage over all types; the reference uses
:func:`tidings.events.matching.matches`, not the code under test.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings.errors import IntermediaryError
from tidings.events.matching import matches
from tidings.intermediary.views.patterns import covered, covers_all, minimal, parse_patterns, widen

ALPHABET = ("a", "b")
FRESH = "z"

segments = st.sampled_from((*ALPHABET, "?"))


@st.composite
def patterns(draw: st.DrawFn) -> tuple[str, ...]:
    body = draw(st.lists(segments, max_size=3))
    return (*body, "*") if draw(st.booleans()) else tuple(body)


def _types(longest: int) -> list[tuple[str, ...]]:
    values = (*ALPHABET, FRESH)
    return [t for n in range(1, longest + 2) for t in itertools.product(values, repeat=n)]


def brute(upstream: list[tuple[str, ...]], pattern: tuple[str, ...]) -> bool:
    longest = max(len(p) for p in [*upstream, pattern])
    return all(any(matches(t, u) for u in upstream) for t in _types(longest) if matches(t, pattern))


@settings(max_examples=600, deadline=None)
@given(st.lists(patterns(), max_size=4), patterns())
def test_covered_agrees_with_brute_force(upstream, pattern) -> None:
    assert covered(upstream, pattern) == brute(upstream, pattern)


@settings(max_examples=200, deadline=None)
@given(st.lists(patterns(), max_size=5))
def test_minimal_keeps_the_union_and_drops_every_redundant_pattern(ps) -> None:
    kept = minimal(ps)
    assert set(kept) <= set(ps)
    for p in ps:
        assert brute(list(kept), p)
    for p in kept:
        assert not brute([q for q in kept if q != p], p)


@pytest.mark.parametrize(
    ("upstream", "pattern", "expected"),
    [
        ([("a",), ("a", "?", "*")], ("a", "*"), True),  # by the union, not by either
        ([("a", "?", "*")], ("a", "*"), False),  # ("a",) itself is missing
        ([("a", "b"), ("a", "c")], ("a", "?"), False),  # infinitely many other segments
        ([("?", "*")], ("*",), True),  # the empty type is never stored
        ([], ("*",), False),
        ([("x", "*")], ("x", "y", "*"), True),
    ],
)
def test_examples(upstream, pattern, expected) -> None:
    assert covered(upstream, pattern) is expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "non-empty list"),
        ("a.*", "non-empty list"),
        ([["a", "*", "b"]], r"events\[0\]: .*'\*' is allowed only as the last"),
        ([[]], r"events\[0\]: expected a list"),
        ([["a", 3]], r"events\[0\]: every segment must be a string"),
        ([["x"] * 17], r"events\[0\]: expected a list of 1 to 16"),
    ],
)
def test_bad_patterns_are_named(spec, message) -> None:
    with pytest.raises(IntermediaryError, match=message):
        parse_patterns(spec)


@settings(max_examples=200, deadline=None)
@given(st.lists(patterns(), max_size=8), st.integers(1, 4))
def test_widen_covers_everything_within_the_limit(ps, limit) -> None:
    wide = widen(ps, limit)
    assert len(wide) <= limit
    for p in ps:
        assert brute(list(wide), p)
    if len(minimal(ps)) <= limit:
        assert wide == minimal(ps)  # nothing widened that did not have to be


def test_widen_cuts_to_the_longest_prefix_that_fits() -> None:
    ps = [("app", "a", "x"), ("app", "a", "y"), ("app", "b", "x"), ("db", "rows.t")]
    assert widen(ps, 3) == (("app", "a", "*"), ("app", "b", "*"), ("db", "rows.t"))
    assert widen(ps, 2) == (("app", "*"), ("db", "*"))
    assert widen(ps, 1) == (("*",),)


def test_a_crafted_subscription_cannot_make_coverage_exponential() -> None:
    """31 patterns (one subscription may send 64) naming one of two literals at one of 15
    positions and a distinct last segment, plus one covering all long types: the exact walk
    for ``?`` x 16 has 3**15 distinct branches (hours of CPU on the event loop). Bounded, the
    decision answers "not covered", the safe side, and widen keeps a superset."""
    hostile = [
        (*("?" * i), f"x{a}", *("?" * (14 - i)), f"z{i}{a}") for i in range(15) for a in range(2)
    ]
    hostile.append((*("?" * 15), "*"))
    assert parse_patterns([list(p) for p in hostile]) == tuple(hostile)
    assert not covered(hostile, ("?",) * 16)  # true, but past the bound: "no"
    assert covers_all(hostile, hostile)  # each is in the set: no walk needed
    wide = widen(hostile)
    for p in hostile:
        for value in ("x0", "x1", "z"):
            t = tuple(value if s == "?" else ("w" if s == "*" else s) for s in p)
            assert any(matches(t, w) for w in wide), t


def test_widen_of_many_subscribers_patterns_stays_linear() -> None:
    """50,000 distinct patterns (about 50 subscribers of 16 keys x 64 patterns): the
    quadratic minimal walk would take hours on the event loop; cut first, it is a set."""
    many = [("s", f"t{i % 500}", f"u{i}") for i in range(50_000)]
    wide = widen(many)
    assert len(wide) <= 256
    assert all(any(matches(p, w) for w in wide) for p in many[::97])
