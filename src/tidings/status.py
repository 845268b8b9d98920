"""What the event log says about delivery: the data behind ``tidings status`` and the demo."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import Engine, func, select

from tidings.events.outbox import OPEN_STATUSES, EventStatus
from tidings.events.timeutil import as_utc, utcnow
from tidings.outbox.schema import ensure_schema, outbox_event

_SCAN = 20_000


@dataclass
class StatusReport:
    by_status: dict[str, int] = field(default_factory=dict)
    by_target: dict[str, Counter[str]] = field(default_factory=dict)
    retries: int = 0
    oldest_open_age: timedelta | None = None
    last_errors: list[tuple[int, str, str]] = field(default_factory=list)

    @property
    def open_events(self) -> int:
        return sum(self.by_status.get(s.value, 0) for s in OPEN_STATUSES)


def status_report(engine: Engine, *, per_target: bool = True) -> StatusReport:
    """Counts per status and per target, the oldest open event's age and the last errors."""
    ensure_schema(engine)
    report = StatusReport()
    oe = outbox_event.c
    with engine.connect() as conn:
        for status, count, retries in conn.execute(
            select(oe.status, func.count(), func.coalesce(func.sum(oe.retry_count), 0)).group_by(
                oe.status
            )
        ):
            report.by_status[status] = count
            report.retries += int(retries)
        oldest = conn.execute(
            select(func.min(oe.logged_at)).where(oe.status.in_([s.value for s in OPEN_STATUSES]))
        ).scalar()
        if oldest is not None:
            report.oldest_open_age = utcnow() - as_utc(oldest)
        report.last_errors = [
            (seq, etype, err or "")
            for seq, etype, err in conn.execute(
                select(oe.seq, oe.event_type, oe.error_details)
                .where(oe.status == EventStatus.FAILED.value)
                .order_by(oe.updated_at.desc())
                .limit(5)
            )
        ]
        if per_target:
            rows = conn.execution_options(yield_per=_SCAN).execute(
                select(oe.deliveries).where(oe.deliveries.is_not(None))
            )
            for (deliveries,) in rows:
                for target, state in json.loads(deliveries).items():
                    report.by_target.setdefault(target, Counter())[state.get("state", "?")] += 1
    return report
