"""Hat event type matching for queries and subscriptions.

A query type is a tuple of strings where ``?`` matches exactly one segment and ``*``, allowed
only as the last segment, matches zero or more segments. :func:`matches` answers for one query
type; :class:`TypeMatcher` answers for many at once with a trie over segments, because a
server checks every new event against the subscriptions of all its clients and modules, and
a loop over every query type would make that cost grow with the number of subscriptions.
It sits with the event model because the server, the client (checking a subscription before
sending it) and the query model all need the same rule for what a query type is.
"""

from __future__ import annotations

from collections.abc import Iterable

from tidings.errors import StoreError
from tidings.events.model import EventType

#: A query or subscription type: segments, ``?`` anywhere, ``*`` only last.
QueryType = tuple[str, ...]

ANY_ONE = "?"
ANY_REST = "*"


def validate_query_type(query_type: object) -> QueryType:
    """Return ``query_type`` if it is a tuple of str with ``*`` only as its last segment.

    The empty tuple is valid (as in Hat) and matches no stored event, since stored types are
    never empty.
    """
    if not isinstance(query_type, tuple):
        raise StoreError(f"query type must be a tuple of str, not {query_type!r}")
    for index, segment in enumerate(query_type):
        if not isinstance(segment, str):
            raise StoreError(f"query type {query_type!r} has a non-str segment {segment!r}")
        if segment == ANY_REST and index != len(query_type) - 1:
            raise StoreError(f"query type {query_type!r}: '*' is allowed only as the last segment")
    return query_type


def matches(event_type: EventType, query_type: QueryType) -> bool:
    """Tell whether ``event_type`` matches ``query_type`` (validated first)."""
    validate_query_type(query_type)
    for index, segment in enumerate(query_type):
        if segment == ANY_REST:
            return True
        if index >= len(event_type):
            return False
        if segment != ANY_ONE and segment != event_type[index]:
            return False
    return len(event_type) == len(query_type)


class _Node:
    """One trie node: the query types sharing the segments on the path from the root."""

    __slots__ = ("any_one", "any_rest", "children", "terminal")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.any_one: _Node | None = None
        #: Some query type is this path followed by ``*``: everything below matches.
        self.any_rest = False
        #: Some query type ends exactly here.
        self.terminal = False


class TypeMatcher:
    """Matches event types against a fixed set of query types in time bounded by the type's
    length and the number of ``?`` branches, not by the number of query types."""

    __slots__ = ("_root",)

    def __init__(self, query_types: Iterable[QueryType]) -> None:
        self._root = _Node()
        for query_type in query_types:
            self._add(validate_query_type(query_type))

    def matches(self, event_type: EventType) -> bool:
        """Tell whether ``event_type`` matches at least one of the query types."""
        pending: list[tuple[_Node, int]] = [(self._root, 0)]
        while pending:
            node, index = pending.pop()
            if node.any_rest:
                return True
            if index == len(event_type):
                if node.terminal:
                    return True
                continue
            child = node.children.get(event_type[index])
            if child is not None:
                pending.append((child, index + 1))
            if node.any_one is not None:
                pending.append((node.any_one, index + 1))
        return False

    def _add(self, query_type: QueryType) -> None:
        node = self._root
        for segment in query_type:
            if segment == ANY_REST:
                node.any_rest = True
                return
            node = self._child(node, segment)
        node.terminal = True

    @staticmethod
    def _child(node: _Node, segment: str) -> _Node:
        """The child of ``node`` for ``segment``, created if missing."""
        if segment == ANY_ONE:
            if node.any_one is None:
                node.any_one = _Node()
            return node.any_one
        return node.children.setdefault(segment, _Node())


def intersect(a: QueryType, b: QueryType) -> QueryType | None:
    """The query type matching exactly the event types both ``a`` and ``b`` match, or None
    if none does (both validated query types).

    One type always suffices, since ``*`` stands only last: position by position a literal
    meets an equal literal or ``?``, ``?`` meets ``?``, and where one side reaches its ``*``
    the other side's rest is what both match from there.
    """
    both: list[str] = []
    for index in range(max(len(a), len(b))):
        x = a[index] if index < len(a) else None
        y = b[index] if index < len(b) else None
        if x == ANY_REST:
            return (*both, *b[index:])
        if y == ANY_REST:
            return (*both, *a[index:])
        if x is None or y is None:
            return None  # one ended without a '*': the lengths differ
        if x == ANY_ONE:
            both.append(y)
        elif y == ANY_ONE or x == y:
            both.append(x)
        else:
            return None
    return tuple(both)


def narrow(
    requested: Iterable[QueryType], allowed: Iterable[QueryType]
) -> tuple[list[QueryType], list[QueryType]]:
    """What of ``requested`` lies within ``allowed``: the query types matching exactly the
    event types some requested type and some allowed type both match, and the requested
    types not wholly within one allowed type (each refused in part or whole).

    Access control by type uses it: a client asking for more than it may see is served what
    it may, and the rest is refused by name.
    """
    allowed = list(allowed)
    kept: list[QueryType] = []
    refused: list[QueryType] = []
    for query_type in requested:
        pieces = [p for a in allowed if (p := intersect(a, query_type)) is not None]
        if query_type in pieces:
            pieces = [query_type]  # wholly allowed: the smaller pieces add nothing
        else:
            refused.append(query_type)
        for piece in pieces:
            if piece not in kept:
                kept.append(piece)
    return kept, refused
