"""A Hat query (``QueryData``): what a client may ask the event server for, checked on creation.

The query is part of the one event model rather than of the server: the client builds it, the
wire codec carries it, the server answers it (:mod:`tidings.server.store.queries`). Checking it when
it is made means a malformed query fails at the edge that received it, before any database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from tidings.errors import StoreError
from tidings.events.matching import QueryType, validate_query_type
from tidings.events.model import EventId, PayloadKind
from tidings.events.validation import INT64_MIN, require_int

Order = Literal["ascending", "descending"]
OrderBy = Literal["timestamp", "source_timestamp"]


@dataclass(frozen=True, slots=True)
class QueryData:
    """A Hat query; every filter that is set must hold (Hat QueryData).

    Timestamps are integer microseconds since the Unix epoch, bounds inclusive. Events lacking
    a source timestamp fail both source bounds and come last when ordered by source timestamp,
    in either direction. ``unique_type`` keeps one event per type, the first in the query's
    order (the latest when descending); ``max_results`` then cuts the result. Queries that can
    match nothing (``max_results <= 0``, a lower bound above its upper bound, an empty
    ``event_ids`` or ``event_types``) give an empty result rather than an error, as Hat does.
    """

    server_id: int | None = None
    event_ids: tuple[EventId, ...] | None = None
    event_types: tuple[QueryType, ...] | None = None
    t_from: int | None = None
    t_to: int | None = None
    source_t_from: int | None = None
    source_t_to: int | None = None
    payload: tuple[PayloadKind, bytes] | None = None
    order: Order = "descending"
    order_by: OrderBy = "timestamp"
    unique_type: bool = False
    max_results: int | None = None

    def __post_init__(self) -> None:
        """Refuse malformed queries here, so a bad client request never reaches the database."""
        for name in ("server_id", "t_from", "t_to", "source_t_from", "source_t_to", "max_results"):
            value = getattr(self, name)
            if value is not None:
                require_int(f"query: {name}", value, INT64_MIN)
        _validate_event_ids(self.event_ids)
        _validate_event_types(self.event_types)
        _validate_payload(self.payload)
        _require_choice("order", self.order, get_args(Order))
        _require_choice("order_by", self.order_by, get_args(OrderBy))
        if not isinstance(self.unique_type, bool):
            raise StoreError(f"query: unique_type must be a bool, not {self.unique_type!r}")

    def matches_nothing(self) -> bool:
        """Whether the query is empty by its own terms, without looking at the store."""
        return (
            (self.max_results is not None and self.max_results <= 0)
            or _inverted(self.t_from, self.t_to)
            or _inverted(self.source_t_from, self.source_t_to)
            or self.event_ids == ()
            or self.event_types == ()
        )


def _inverted(lower: int | None, upper: int | None) -> bool:
    return lower is not None and upper is not None and lower > upper


def _require_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise StoreError(f"query: {name} must be one of {', '.join(choices)}, not {value!r}")


def _validate_event_ids(event_ids: object) -> None:
    """Event ids are a tuple of EventId with int64 parts, so the database can compare them."""
    if event_ids is None:
        return
    if not isinstance(event_ids, tuple):
        raise StoreError(f"query: event_ids must be a tuple of EventId, not {event_ids!r}")
    for event_id in event_ids:
        if not isinstance(event_id, EventId):
            raise StoreError(f"query: event_ids must hold EventId, not {event_id!r}")
        for part in ("server", "session", "instance"):
            require_int(f"query: event id {part}", getattr(event_id, part), INT64_MIN)


def _validate_event_types(event_types: object) -> None:
    if event_types is None:
        return
    if not isinstance(event_types, tuple):
        raise StoreError(f"query: event_types must be a tuple of types, not {event_types!r}")
    for query_type in event_types:
        validate_query_type(query_type)


def _validate_payload(payload: object) -> None:
    if payload is None:
        return
    if (
        not isinstance(payload, tuple)
        or len(payload) != 2
        or not isinstance(payload[0], PayloadKind)
        or not isinstance(payload[1], bytes)
    ):
        raise StoreError(f"query: payload must be a (PayloadKind, bytes) pair, not {payload!r}")
