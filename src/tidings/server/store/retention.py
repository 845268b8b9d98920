"""Discarding events every reader is done with, so that the active log stays small.

FTN18 (2.3.1) keeps an event in the active store until the last registered consumer has
read it; the streams decide what that means for them and call :func:`discard` with it:
delete the events of some types up to a position, except those another reader still needs
(``keep``: events of those types above that reader's position), and except the latest
event of each type (by timestamp, the order of Hat's latest-value queries), so that a query
for a type's current value still answers. Events younger than ``older_than_us`` stay too:
the store recognises a re-published outbox event by the stored copy, so the age is how long
that recognition is guaranteed (like JetStream's duplicate window).

A pass reads its candidates from a snapshot, then deletes at most ``limit`` of them in one
short transaction under the append lock; a caller repeats passes until one deletes nothing
(or, with :func:`discard_chunk`, goes on after the candidates it examined). The server's
own log retention (:mod:`tidings.server.log_retention`) uses the same passes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from tidings.errors import StoreError
from tidings.events.matching import QueryType, TypeMatcher
from tidings.server.store.driver import DriverCursor
from tidings.server.store.facade import EventStore
from tidings.server.store.schema import decode_type, events_table
from tidings.server.store.type_patterns import type_condition_of


@dataclass(frozen=True, slots=True)
class Keep:
    """Events of ``types`` above ``position`` are still needed by some reader."""

    types: Sequence[QueryType]
    position: int


def discard(
    store: EventStore,
    types: Sequence[QueryType],
    up_to: int,
    keep: Sequence[Keep],
    older_than_us: int,
    limit: int = 10_000,
) -> int:
    """Delete at most ``limit`` events (see the module docstring); how many were deleted."""
    return discard_chunk(store, types, up_to, keep, older_than_us, limit).deleted


@dataclass(frozen=True, slots=True)
class Chunk:
    """What one :func:`discard_chunk` did: ``deleted`` events, of the candidates up to
    position ``examined`` (0: there were none); the next chunk starts after it."""

    deleted: int
    examined: int


def discard_chunk(
    store: EventStore,
    types: Sequence[QueryType],
    up_to: int,
    keep: Sequence[Keep] | Callable[[], Sequence[Keep]],
    older_than_us: int,
    limit: int = 10_000,
    *,
    after: int = 0,
    spare: Collection[int] | Callable[[], Collection[int]] = frozenset(),
) -> Chunk:
    """:func:`discard` over the candidates after position ``after``, sparing the events at
    the positions ``spare`` too (what a reader needs that is not a range of positions: the
    newest event of each key of a table). A caller that goes on from ``examined`` gets past
    candidates that stay, instead of reading them again.

    ``keep`` and ``spare`` may be calls: they are made after the candidates are read, just
    before the delete, so that a reader that arrived since (a consumer registered, a Syncer
    peer connected, a table loaded) is asked too."""
    if up_to <= after or not types:
        return Chunk(0, 0)
    table = events_table.name
    with store.snapshot("select events to discard") as conn:
        sql = DriverCursor.of(conn)
        try:
            condition, params = type_condition_of(
                sql,
                store,
                "position > ? AND position <= ? AND timestamp_us < ?",
                [after, up_to, older_than_us],
                types,
            )
            if condition is None:
                return Chunk(0, 0)
            rows = sql.rows(
                f"SELECT position, type FROM {table} WHERE {condition} ORDER BY position LIMIT ?",
                [*params, limit],
            )
            latest = _latest_of_types(sql, {text for _, text in rows})
        except sql.error as exc:
            raise StoreError(
                f"event store {store.url}: cannot select events to discard: {exc}"
            ) from exc
    if not rows:
        return Chunk(0, 0)
    if callable(keep):
        keep = keep()
    if callable(spare):
        spare = spare()
    keepers = [(TypeMatcher(k.types), k.position) for k in keep]
    doomed = []
    decoded: dict[str, tuple[str, ...]] = {}
    for position, text in rows:
        if position in latest or position in spare:
            continue
        event_type = decoded.setdefault(text, decode_type(text))
        if any(position > bound and m.matches(event_type) for m, bound in keepers):
            continue
        doomed.append(position)
    deleted = store.delete_positions(doomed) if doomed else 0
    return Chunk(deleted, rows[-1][0])


def _latest_of_types(sql: DriverCursor, texts: set[str]) -> set[int]:
    """The position of each type's latest event by timestamp (one index probe per type)."""
    latest: set[int] = set()
    for text in texts:
        found = sql.rows(
            f"SELECT position FROM {events_table.name} WHERE type = ? ORDER BY timestamp_us "
            "DESC, server DESC, session DESC, instance DESC LIMIT 1",
            [text],
        )
        latest.update(position for (position,) in found)
    return latest
