"""Who may do what on one stream: its users' grants (:mod:`tidings.config.stream_access`)
as the stream's functions ask them.

The checks run once the caller is authenticated and before a function does anything, so a
refused call changes nothing (a push session already running on the channel goes on). A
refusal is :class:`~tidings.errors.StreamRefused`, FTN3's ``Unauthorized``, naming the user
and what it may not have: the stream, the component, the types, the type or the data of an
``addEvent``; the connection stays open for what is allowed. A user without an ``allow``
list may do everything.

What a consumer may read becomes its :class:`~.selection.Selection`: its ``want`` (null:
every type it may read) and, per type, the data filters of the grants that let it read it
(any of them may pass an event; a grant without a filter passes all).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidings.config.stream_access import StreamGrant, matching, name_pattern
from tidings.errors import StreamError, StreamRefused
from tidings.events.data_filter import DataFilter, compile_filter
from tidings.streams.protocol.ftn3 import INVALID_REQUEST
from tidings.streams.service.selection import EVERYTHING, DataCondition, Selection
from tidings.streams.typemap import TypeMap


@dataclass(frozen=True)
class _Grant:
    """One grant as it applies to this stream: the stream's type names it reads and adds."""

    components: tuple[re.Pattern[str], ...]
    reads: frozenset[str]
    adds: frozenset[str]
    where: DataFilter | None

    def covers(self, component: str) -> bool:
        return any(pattern.match(component) for pattern in self.components)


@dataclass(frozen=True)
class _AnyOf:
    """The filters of several grants: an event passes if one of them passes it."""

    filters: tuple[DataFilter, ...]

    def __call__(self, data: Any) -> bool:
        return any(f(data) for f in self.filters)


class StreamAccess:
    """The permissions of one stream's users; see the module docstring."""

    def __init__(
        self, stream: str, type_map: TypeMap, users: Mapping[str, list[StreamGrant] | None]
    ) -> None:
        self.stream = stream
        self._type_map = type_map
        generable = [n for n in type_map.names if type_map.event_type_of(n) is not None]
        #: Per user its grants that name this stream; None: it may do everything.
        self._grants: dict[str, tuple[_Grant, ...] | None] = {}
        for user, grants in users.items():
            if grants is None:
                self._grants[user] = None
                continue
            self._grants[user] = tuple(
                _Grant(
                    tuple(name_pattern(p) for p in grant.components),
                    frozenset(matching(grant.types, type_map.names)),
                    frozenset(matching(grant.add_event, generable)),
                    None if grant.where is None else compile_filter(grant.where),
                )
                for grant in grants
                if matching(grant.streams, [stream])
            )

    def check_stream(self, user: str) -> None:
        """Refuse a user that no grant lets use this stream."""
        if self._grants.get(user, ()) == ():
            raise StreamRefused(user, "stream", f"user {user!r} may not use stream {self.stream!r}")

    def check_component(self, user: str, component: str) -> None:
        """Refuse a consumer component the user may not consume this stream as."""
        grants = self._grants.get(user, ())
        if grants is not None:
            self._readable(user, grants, component)

    def selection(self, user: str, component: str, want: Sequence[str] | None) -> Selection:
        """What the consumer ``(user, component)`` asking for ``want`` is sent; InvalidRequest
        for a ``want`` naming a type the stream does not carry (or none at all: such a
        consumer would wait in silence for what never comes), Unauthorized for a component
        or a type the user may not read."""
        grants = self._grants.get(user, ())
        if grants is None:
            self._check_known(want, self._type_map.names)
            return EVERYTHING if want is None else Selection(frozenset(want))
        readable = self._readable(user, grants, component)
        self._check_known(want, tuple(readable), f"user {user!r} may read", component)
        names = dict.fromkeys(readable if want is None else want)
        refused = [name for name in names if name not in readable]
        if refused:
            raise StreamRefused(
                user,
                "type",
                f"user {user!r} may not read {', '.join(refused)} of stream {self.stream!r} "
                f"as component {component} (it may read {', '.join(readable)})",
            )
        filters: dict[str, DataCondition] = {}
        for name in names:
            conditions = readable[name]
            if None not in conditions:
                kept = tuple(c for c in conditions if c is not None)
                filters[name] = kept[0] if len(kept) == 1 else _AnyOf(kept)
        return Selection(frozenset(names), filters)

    def check_add(self, user: str, name: str, data: Any) -> None:
        """Refuse an ``addEvent`` of type ``name`` with ``data`` that the user's grants do
        not allow: a type no grant lists under ``add_event``, or data that fails the filters
        of every grant that does."""
        grants = self._grants.get(user, ())
        if grants is None:
            return
        allowed = [grant for grant in grants if name in grant.adds]
        if not allowed:
            may = sorted({n for grant in grants for n in grant.adds})
            raise StreamRefused(
                user,
                "add_event",
                f"user {user!r} may not add events of type {name} to stream {self.stream!r} "
                f"(it may add {', '.join(may) or 'none'})",
            )
        if any(grant.where is None or grant.where(data) for grant in allowed):
            return
        filters = " | ".join(g.where.describe() for g in allowed if g.where is not None)
        raise StreamRefused(
            user,
            "add_event_data",
            f"user {user!r} may not add this {name} event to stream {self.stream!r}: its data "
            f"does not pass the user's filter ({filters})",
        )

    def _readable(
        self, user: str, grants: tuple[_Grant, ...], component: str
    ) -> dict[str, list[DataFilter | None]]:
        """The types ``(user, component)`` may read, in the stream's order, with the
        filters of the grants that allow each; Unauthorized if there are none."""
        readable: dict[str, list[DataFilter | None]] = {}
        for grant in grants:
            if grant.covers(component):
                for name in grant.reads:
                    readable.setdefault(name, []).append(grant.where)
        if not readable:
            raise StreamRefused(
                user,
                "component",
                f"user {user!r} may not consume stream {self.stream!r} as component {component}",
            )
        return {name: readable[name] for name in self._type_map.names if name in readable}

    def _check_known(
        self, want: Sequence[str] | None, shown: Sequence[str], who: str = "", component: str = ""
    ) -> None:
        """Refuse a ``want`` that names a type the stream does not carry, or no type at all:
        those types could never arrive, and the consumer would wait for them in silence (a
        mistyped name among good ones as much as a list of only unknown ones). FTN18 lets a
        generator skip what it does not produce; a stream server knows what it carries, so
        it says so, listing ``shown``: what the stream carries, or for a user with
        permissions (``who``), what that user may read as ``component``."""
        if want is None:
            return
        known = self._type_map.names
        unknown = [name for name in dict.fromkeys(want) if name not in known]
        if unknown or not want:
            what = f"does not carry {', '.join(unknown)}" if unknown else "got an empty list"
            carried = (
                f"{who} {', '.join(shown)} as component {component}"
                if who
                else f"it carries {', '.join(shown)}"
            )
            raise StreamError(
                INVALID_REQUEST,
                f"want: stream {self.stream!r} {what} ({carried}; null wants them all)",
            )
