"""Time helpers: tidings keeps every timestamp in UTC."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """Attach UTC to a naive datetime read back from SQLite; convert aware ones to UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def sqlite_text(value: datetime) -> str:
    """The text form SQLAlchemy's SQLite DateTime type stores, for raw driver inserts."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
