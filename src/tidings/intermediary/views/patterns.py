"""Coverage of hat-style event-type patterns (claim 1 for event subscriptions).

An intermediary subscribes to the event server for a set of patterns (``?`` one segment, a
final ``*`` any number, :mod:`tidings.events.matching`). A subscriber's new pattern needs
nothing new upstream when the upstream patterns *together* already match every type it
matches: ``("a", "*")`` is covered by ``{("a",), ("a", "?", "*")}`` though by neither alone.

The decision is exact, over the real universe of event types: non-empty tuples of arbitrary
strings. Segment values are infinitely many, but at any position only the literals that some
pattern names there can be told apart; every other value behaves as one "fresh" value. So
:func:`covered` walks the pattern segment by segment, branching on ``?`` and ``*`` over those
literals plus one fresh value, and keeps, for each branch, the remainders of the upstream
patterns that still match (their derivatives). Upstream ``("*",)``-remainders end a branch at
once; every other remainder gets shorter each step, so the walk ends. It is exponential in
the number of ``?``/``*`` segments of one pattern (at most :data:`MAX_SEGMENTS`), with the
literals named at each position as the base: 31 crafted patterns of 16 segments would take
hours. So the walk is bounded: past :data:`MAX_COVER_STEPS` branches in one decision (one
:func:`covers_all`, one :func:`widen`) the answer is "not covered", which is always safe
here (a pattern is kept, or asked upstream, that was not needed: more events upstream, never
fewer).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterable, Iterator

from tidings.errors import IntermediaryError, StoreError
from tidings.events.matching import ANY_ONE, ANY_REST, QueryType, validate_query_type

#: The most segments in a subscriber's pattern, and the most bytes of one segment.
MAX_SEGMENTS = 16
MAX_SEGMENT_BYTES = 256
#: The most patterns in one subscription.
MAX_PATTERNS = 64
#: The most patterns an intermediary subscribes upstream for; past it they are widened.
MAX_UPSTREAM = 256
#: The most distinct patterns :func:`widen` makes minimal as they are (quadratic); more are
#: cut first.
MAX_MINIMAL = 256

#: The most branches one coverage decision (:func:`covers_all`, :func:`widen`) explores
#: before it answers "not covered" (a few tens of milliseconds of CPU).
MAX_COVER_STEPS = 2_000

#: A segment value equal to no literal: stands for all values no pattern names.
_FRESH = object()


class _Exhausted(Exception):
    """The walk took more than its steps."""


class _Budget(threading.local):
    """Steps left to the decision under way in this thread (None: none under way)."""

    left: int | None = None


_budget = _Budget()


def parse_patterns(spec: object) -> tuple[QueryType, ...]:
    """A subscription's ``"events"`` field: a non-empty list of patterns, each a non-empty
    list of strings with ``*`` only last; :class:`IntermediaryError` names what is wrong."""
    if not isinstance(spec, list) or not spec:
        raise IntermediaryError("events: expected a non-empty list of patterns")
    if len(spec) > MAX_PATTERNS:
        raise IntermediaryError(f"events: more than {MAX_PATTERNS} patterns")
    patterns = []
    for index, item in enumerate(spec):
        where = f"events[{index}]"
        if not isinstance(item, list) or not item or len(item) > MAX_SEGMENTS:
            raise IntermediaryError(
                f"{where}: expected a list of 1 to {MAX_SEGMENTS} strings, got {str(item)[:60]}"
            )
        if any(not isinstance(s, str) or len(s.encode()) > MAX_SEGMENT_BYTES for s in item):
            raise IntermediaryError(
                f"{where}: every segment must be a string of at most {MAX_SEGMENT_BYTES} bytes"
            )
        try:
            patterns.append(validate_query_type(tuple(item)))
        except StoreError as exc:
            raise IntermediaryError(f"{where}: {exc}") from None
    return tuple(dict.fromkeys(patterns))


def _step(patterns: frozenset[QueryType], value: object) -> frozenset[QueryType]:
    """What remains of each pattern that matches ``value`` as a type's next segment."""
    out = set()
    for p in patterns:
        if not p:
            continue
        head = p[0]
        if head == ANY_REST:
            out.add(p)
        elif head in (ANY_ONE, value):
            out.add(p[1:])
    return frozenset(out)


def _values(patterns: frozenset[QueryType]) -> list[object]:
    """The segment values the patterns tell apart at this position, plus the fresh one."""
    heads = {p[0] for p in patterns if p and p[0] not in (ANY_ONE, ANY_REST)}
    return [*sorted(heads), _FRESH]


@functools.lru_cache(maxsize=4096)
def _covered(pattern: QueryType, upstream: frozenset[QueryType], top: bool) -> bool:
    if _budget.left is not None:
        if _budget.left <= 0:
            raise _Exhausted
        _budget.left -= 1
    if (ANY_REST,) in upstream or pattern in upstream:
        return True
    if not upstream:
        # Every pattern matches some type, except () at the top (it matches only the empty
        # type, which is never stored).
        return top and not pattern
    if not pattern:
        return top or () in upstream
    head = pattern[0]
    if head == ANY_REST:
        # ``*`` = the empty rest, or any value followed by ``*`` again.
        if not top and () not in upstream:
            return False
        return all(_covered(pattern, _step(upstream, v), False) for v in _values(upstream))
    if head == ANY_ONE:
        rest = pattern[1:]
        return all(_covered(rest, _step(upstream, v), False) for v in _values(upstream))
    return _covered(pattern[1:], _step(upstream, head), False)


def covered(upstream: Iterable[QueryType], pattern: QueryType) -> bool:
    """Whether every (non-empty) event type ``pattern`` matches is matched by some pattern
    of ``upstream``: exact, neither a wrong yes nor a wrong no, within
    :data:`MAX_COVER_STEPS`; past them "no"."""
    return covers_all(upstream, (pattern,))


def covers_all(upstream: Iterable[QueryType], patterns: Iterable[QueryType]) -> bool:
    """Whether ``upstream`` covers every one of ``patterns`` (:func:`covered`), all of them
    within one :data:`MAX_COVER_STEPS`."""
    held = frozenset(upstream)
    with _bounded():
        try:
            return all(_covered(pattern, held, True) for pattern in patterns)
        except _Exhausted:
            return False


@contextlib.contextmanager
def _bounded() -> Iterator[None]:
    """:data:`MAX_COVER_STEPS` for what runs inside, unless an enclosing call set them."""
    if _budget.left is not None:
        yield
        return
    _budget.left = MAX_COVER_STEPS
    try:
        yield
    finally:
        _budget.left = None


def minimal(patterns: Iterable[QueryType]) -> tuple[QueryType, ...]:
    """The same union with no pattern the others cover (drop them one at a time, so two
    equal-language patterns do not both go). Sorted, so equal sets compare equal."""
    kept = sorted(set(patterns))
    with _bounded():
        for p in list(kept):
            others = [q for q in kept if q != p]
            if covered(others, p):
                kept = others
    return tuple(kept)


def widen(patterns: Iterable[QueryType], limit: int = MAX_UPSTREAM) -> tuple[QueryType, ...]:
    """At most ``limit`` patterns matching at least what ``patterns`` match (the patent's
    bounding region, for types): each pattern is cut to its first ``d`` segments followed by
    ``*``, with the largest ``d`` that gives few enough; ``("*",)`` at worst. Extra events
    upstream cost bandwidth, never correctness: each subscriber's own patterns select.
    :func:`minimal` is quadratic, so past :data:`MAX_MINIMAL` distinct patterns they are cut
    (a set, linear) until that few remain, then made minimal."""
    kept = tuple(sorted(set(patterns)))
    depth = max((len(p) for p in kept), default=0)
    while len(kept) > max(limit, MAX_MINIMAL) and depth > 0:
        depth -= 1
        kept = tuple(sorted({_cut(p, depth) for p in kept}))
    with _bounded():
        kept = minimal(kept)
        while len(kept) > limit and depth > 0:
            depth -= 1
            kept = minimal(_cut(p, depth) for p in kept)
    return kept if len(kept) <= limit else ((ANY_REST,),)


def _cut(pattern: QueryType, depth: int) -> QueryType:
    """``pattern``'s first ``depth`` segments then ``*`` (itself if it is no longer)."""
    return pattern if len(pattern) <= depth else (*pattern[:depth], ANY_REST)
