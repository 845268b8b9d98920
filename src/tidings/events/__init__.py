"""The one event model of tidings: the bottom of the layers, imported by every other part.

An event is seen from several sides, and each side is a module here: the outbox row the
producer writes and the relay reads (:mod:`~tidings.events.outbox`), the event as the event
server stores and serves it (:mod:`~tidings.events.model`), the checks every edge applies
before storing one (:mod:`~tidings.events.validation`), the queries and type patterns that
select events (:mod:`~tidings.events.query`, :mod:`~tidings.events.matching`), conditions on
an event's data that decide who may see it (:mod:`~tidings.events.data_filter`) and the UTC
time helpers they share (:mod:`~tidings.events.timeutil`).

Data flows up from here: the outbox, the wire codec, the server, the client and the targets
all import these names, and nothing here imports them back. The package needs neither
SQLAlchemy nor PySpark, so a client or a consumer loads the model without the database or
Spark stacks. The names below are the model a user of tidings meets; the edges' own checks
and the time helpers stay in their modules.
"""

from tidings.events.matching import QueryType, TypeMatcher, matches, validate_query_type
from tidings.events.model import (
    EventId,
    EventType,
    NewEvent,
    PayloadKind,
    StoredEvent,
    json_event,
)
from tidings.events.outbox import OPEN_STATUSES, DeliveryState, EventStatus, OutboxEvent
from tidings.events.query import Order, OrderBy, QueryData
from tidings.events.validation import validate_new_event

__all__ = [
    "OPEN_STATUSES",
    "DeliveryState",
    "EventId",
    "EventStatus",
    "EventType",
    "NewEvent",
    "Order",
    "OrderBy",
    "OutboxEvent",
    "PayloadKind",
    "QueryData",
    "QueryType",
    "StoredEvent",
    "TypeMatcher",
    "json_event",
    "matches",
    "validate_new_event",
    "validate_query_type",
]
