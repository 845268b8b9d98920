"""Time helpers: tidings keeps every timestamp in UTC.

An event's times (logged-at, the server's timestamp, the source timestamp) are compared
across the producer, the relay and the stores, so they are made and read back one way, here.
"""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """Attach UTC to a naive datetime read back from SQLite; convert aware ones to UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
