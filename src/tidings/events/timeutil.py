"""Time helpers: tidings keeps every timestamp in UTC.

An event's times (logged-at, the server's timestamp, the source timestamp) are compared
across the producer, the relay and the stores, so they are made and read back one way, here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """Attach UTC to a naive datetime read back from SQLite; convert aware ones to UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def sqlite_text(value: datetime) -> str:
    """The text form SQLAlchemy's SQLite DateTime type stores, for raw driver inserts."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def driver_stamp(dialect: str) -> Callable[[datetime], Any]:
    """How to pass a datetime to the raw driver so that SQLAlchemy reads it back the same."""
    return sqlite_text if dialect == "sqlite" else _unchanged


def _unchanged(value: datetime) -> datetime:
    return value
