"""The outbox events the target tests publish: one builder, so that every kind's tests and
the contract suite (:mod:`tests.targets.contract`) send the same rows."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from tidings.events.outbox import OutboxEvent

LOGGED_AT = datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=UTC)


def event(seq: int, **fields: Any) -> OutboxEvent:
    """An event of type ``order.created`` with a fresh id and the payload ``{"n": seq}``;
    ``fields`` override any attribute."""
    values: dict[str, Any] = {
        "seq": seq,
        "event_id": uuid.uuid4().hex,
        "event_type": "order.created",
        "payload": f'{{"n": {seq}}}',
        "logged_at": LOGGED_AT,
    }
    values.update(fields)
    return OutboxEvent(**values)


def full_event(seq: int, headers: dict[str, str], **fields: Any) -> OutboxEvent:
    """An event with every optional attribute set (a non-ASCII payload, version 2, a
    correlation id, an originator, the partition key ``order-1``) and ``headers``: what a
    kind's test reads back to see each attribute where that kind carries it."""
    values: dict[str, Any] = {
        "payload": '{"id": 1, "name": "Grüße"}',
        "version": "2",
        "correlation_id": "corr-1",
        "originator": "shop",
        "partition_key": "order-1",
        "headers": headers,
    }
    return event(seq, **(values | fields))
