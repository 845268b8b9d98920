"""The console's audit trail: who did what to which events, and when.

Kept in a SQLite file of the console's own (``console.audit_file``), not in the outbox: the
outbox's schema belongs to the library and its producers, and the trail must survive the
housekeeping that deletes published events. An entry is written after its action ran,
with the action's outcome (how many events it changed), so the trail says what happened,
not what was asked; an action that failed is recorded with its error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, Text, select

from tidings.db import make_engine
from tidings.events.timeutil import as_utc, utcnow

_metadata = MetaData()
audit_entry = Table(
    "console_audit",
    _metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("user", String(64), nullable=False),
    Column("action", String(32), nullable=False),
    Column("target", Text, nullable=False),  # what it applied to: event ids, a filter
    Column("detail", Text, nullable=False),  # JSON: the reason, the counts, an error
    sqlite_autoincrement=True,
)


@dataclass(frozen=True)
class AuditEntry:
    at: datetime
    user: str
    action: str
    target: str
    detail: dict[str, Any]


class AuditTrail:
    """The entries of one audit file (created on first use)."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.engine = make_engine(f"sqlite:///{path}")
        _metadata.create_all(self.engine)

    def record(self, user: str, action: str, target: str, **detail: Any) -> None:
        """Add one entry, now."""
        with self.engine.begin() as conn:
            conn.execute(
                audit_entry.insert().values(
                    at=utcnow(),
                    user=user,
                    action=action,
                    target=target,
                    detail=json.dumps(detail, ensure_ascii=False, sort_keys=True),
                )
            )

    def newest(self, limit: int = 100, *, about: str | None = None) -> list[AuditEntry]:
        """The newest entries first; ``about``: only those whose target names it."""
        query = select(audit_entry).order_by(audit_entry.c.id.desc()).limit(limit)
        if about is not None:
            query = query.where(audit_entry.c.target.contains(about, autoescape=True))
        with self.engine.connect() as conn:
            return [
                AuditEntry(as_utc(r.at), r.user, r.action, r.target, json.loads(r.detail))
                for r in conn.execute(query)
            ]

    def close(self) -> None:
        self.engine.dispose()
