"""Hat type patterns turned into conditions on the event store's stored type text.

A query selects events by type patterns (``?`` one segment, ``*`` the rest); the store keeps
each type as its ``encode_type`` text (canonical JSON, compared in byte order on both
databases). The types sharing the segments before a pattern's first wildcard are one range
of that text, and for a pattern without ``?`` that range is exactly the types it matches, so
such patterns need no look-up at all. Patterns with ``?`` are resolved in Python
(TypeMatcher) against the candidate ranges of the table of distinct types (``event_types``:
thousands of rows where the log has millions); the result is cached per store until that
table grows, and it is the candidate ranges again when every candidate matched, else the
list of matched types. The queries (:mod:`.queries`) put the resulting :class:`TypeFilter`
into their statements with :func:`type_condition`; reads by position (:mod:`.positions`) and
retention (:mod:`.retention`) join it to their own condition with :func:`type_condition_of`.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tidings.events.matching import ANY_ONE, ANY_REST, QueryType, TypeMatcher
from tidings.events.model import encode_type
from tidings.server.store.driver import DriverCursor
from tidings.server.store.facade import EventStore
from tidings.server.store.schema import decode_type

#: Up to this many exact types are inline parameters; longer lists are one JSON parameter.
_INLINE_TYPES = 16
#: Resolved patterns kept per store.
_CACHED_PATTERNS = 256


@dataclass(frozen=True, slots=True)
class TypeFilter:
    """Stored types, as type text: ``equal`` ones and ``[low, high)`` ``ranges`` of the
    text, or, when those would take in types the patterns do not match, the ``listed``
    matching types."""

    equal: tuple[str, ...] = ()
    ranges: tuple[tuple[str, str], ...] = ()
    listed: tuple[str, ...] | None = None

    def is_empty(self) -> bool:
        if self.listed is not None:
            return not self.listed
        return not self.equal and not self.ranges


@dataclass(slots=True)
class _Resolved:
    """A store's resolved patterns, valid while ``event_types`` has ``known`` rows: the
    table only grows, so the same number of rows is the same set of types."""

    known: int
    filters: dict[tuple[QueryType, ...], TypeFilter | None] = field(default_factory=dict)


_resolved: weakref.WeakKeyDictionary[EventStore, _Resolved] = weakref.WeakKeyDictionary()
_resolved_lock = threading.Lock()


def type_filter(
    sql: DriverCursor, store: EventStore, query_types: tuple[QueryType, ...] | None
) -> TypeFilter | None:
    """The stored types ``query_types`` select; None when every type is selected (no type
    condition is needed then)."""
    if query_types is None or (ANY_REST,) in query_types:
        return None
    candidates = _type_candidates(query_types)
    if candidates is not None and not any(ANY_ONE in q for q in query_types):
        return candidates  # without "?" the candidates are exactly the matching types
    known: int = sql.rows("SELECT count(*) FROM event_types")[0][0]
    with _resolved_lock:
        cached = _resolved.get(store)
        if cached is not None and cached.known == known and query_types in cached.filters:
            return cached.filters[query_types]
    types = _resolve(sql, query_types, candidates)
    with _resolved_lock:
        cached = _resolved.get(store)
        if cached is None or cached.known < known:
            cached = _resolved[store] = _Resolved(known)
        if cached.known == known:  # else a newer snapshot has filled the cache
            if len(cached.filters) >= _CACHED_PATTERNS:
                cached.filters.clear()
            cached.filters[query_types] = types
    return types


def _resolve(
    sql: DriverCursor, query_types: Sequence[QueryType], candidates: TypeFilter | None
) -> TypeFilter | None:
    """Match the candidate types (every known type if ``candidates`` is None) in Python."""
    statement = "SELECT t.type FROM event_types t"
    params: list[Any] = []
    if candidates is not None:
        condition, params = type_condition(sql, candidates, "t.type")
        statement += f" WHERE {condition}"
    read = [text for (text,) in sql.rows(statement, params)]
    matcher = TypeMatcher(query_types)
    matched = tuple(sorted(text for text in read if matcher.matches(decode_type(text))))
    if len(matched) == len(read):
        return candidates
    return TypeFilter(listed=matched)


def _type_candidates(query_types: Sequence[QueryType]) -> TypeFilter | None:
    """The stored types that may match ``query_types``: for each pattern, the types of its
    segments before the first wildcard followed by anything (a range of the type text) or
    by nothing; None when every type may (a pattern starts with ``?``)."""
    equal: set[str] = set()
    prefixes: set[str] = set()
    for query_type in query_types:
        fixed = _fixed_prefix(query_type)
        if fixed == query_type:
            equal.add(encode_type(query_type))  # "[]" for (), which matches no stored type
            continue
        if not fixed:
            return None  # starts with "?" (a lone "*" never gets here): every type
        if query_type[len(fixed)] == ANY_REST:
            equal.add(encode_type(fixed))  # "*" matching zero segments
        prefixes.add(encode_type(fixed)[:-1] + ",")
    # A prefix ends with ","; the texts starting with it are those from it up to the same
    # text with "-" (the next character) instead: a range the indexes serve, unlike LIKE,
    # which would also need escaping of the JSON text.
    ranges = tuple((prefix, prefix[:-1] + "-") for prefix in sorted(prefixes))
    return TypeFilter(equal=tuple(sorted(equal)), ranges=ranges)


def _fixed_prefix(query_type: QueryType) -> QueryType:
    """The segments of ``query_type`` before its first wildcard."""
    for index, segment in enumerate(query_type):
        if segment in (ANY_ONE, ANY_REST):
            return query_type[:index]
    return query_type


def type_condition(
    sql: DriverCursor, types: TypeFilter, column: str, *, filter_only: bool = False
) -> tuple[str, list[Any]]:
    """``column`` (the type text) among ``types``; ``filter_only`` keeps the planners from
    reading by type (see ``_in_order`` in :mod:`.queries`): SQLite through
    ``+column``, PostgreSQL by a long list in an expression, which it cannot turn into a join
    (a hashed subplan filters rows)."""
    if filter_only and not sql.postgresql:
        column = f"+{column}"
    if types.listed is not None:
        return _among(sql, column, types.listed, filter_only)
    terms: list[str] = []
    params: list[Any] = []
    for low, high in types.ranges:
        terms.append(f"({column} >= ? AND {column} < ?)")
        params += [low, high]
    if types.equal:
        term, values = _among(sql, column, types.equal, filter_only)
        terms.append(term)
        params += values
    return f"({' OR '.join(terms)})", params


def _among(
    sql: DriverCursor, column: str, values: Sequence[str], filter_only: bool
) -> tuple[str, list[Any]]:
    """``column`` equal to one of ``values``: a few inline, more as one JSON array parameter
    (no driver limit on the number of bound parameters then; psycopg takes 10 us per
    element to send a text[], escaping each)."""
    if len(values) <= _INLINE_TYPES:
        return f"{column} IN ({', '.join('?' * len(values))})", list(values)
    if not sql.postgresql:
        return f"{column} IN (SELECT value FROM json_each(?))", [json.dumps(values)]
    condition = f"{column} IN (SELECT json_array_elements_text(?::json))"
    return f"({condition}) IS TRUE" if filter_only else condition, [json.dumps(values)]


def type_condition_of(
    sql: DriverCursor,
    store: EventStore,
    condition: str,
    params: list[Any],
    types: Sequence[QueryType] | None,
) -> tuple[str | None, list[Any]]:
    """``condition`` joined with the condition on the type column that selects ``types``
    (``None``: any type); None instead of a condition when no stored type can match."""
    if types is None:
        return condition, params
    found = type_filter(sql, store, tuple(types))
    if found is None:
        return condition, params
    if found.is_empty():
        return None, params
    term, values = type_condition(sql, found, "type", filter_only=True)
    return f"{condition} AND {term}", [*params, *values]
