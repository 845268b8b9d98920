"""What the event log says about delivery: the data behind ``tidings status``, the relay's
gauges and the demo.

:func:`health_report` is what ``tidings status`` and the metrics read. It must stay cheap on
a log of ten million rows, so it reads only what an index bounds: rows that are not
PUBLISHED (the status index ``idx_01`` ranges over them; a healthy log has few), the newest
``seq`` (the primary key), the relay's watermark and newest batch (the batch log's
``(job, max_seq)`` index) and the first row above the watermark. PUBLISHED rows are never
counted: that would read the whole log. :func:`status_report` counts every row and is kept
for the demo, whose scratch log is small.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, func, select, text

from tidings.events.outbox import OPEN_STATUSES, EventStatus
from tidings.events.timeutil import as_utc, utcnow
from tidings.outbox.schema import OPEN_ROW, batch_log, ensure_schema, outbox_event
from tidings.routing.table import Routes

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
    """Counts per status and per target, the oldest open event's age and the last errors.

    Reads every row (and, with ``per_target``, every row's deliveries): for the demo's small
    log only; an operator's view of a real log is :func:`health_report`.
    """
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


#: The statuses :func:`health_report` counts: every one but PUBLISHED.
NOT_PUBLISHED: tuple[str, ...] = tuple(s.value for s in EventStatus if s != EventStatus.PUBLISHED)
#: The relay's job name in the batch log.
RELAY_JOB = "relay"

_KEYS_BEHIND_FAILED = text(
    # Outer rows through idx_01 (status = 'FAILED'); the inner probe through the partial
    # idx_03 (partition_key, seq) of open rows, spelled as it is.
    "SELECT count(DISTINCT f.partition_key) FROM outbox_event f "
    "WHERE f.status = 'FAILED' AND f.partition_key IS NOT NULL AND EXISTS ("
    "SELECT 1 FROM outbox_event WHERE outbox_event.partition_key = f.partition_key "
    f"AND outbox_event.seq > f.seq AND {OPEN_ROW.text})"
)


@dataclass
class TargetFigures:
    """Events not yet confirmed at one target, by why (counted over non-PUBLISHED rows)."""

    pending: int = 0
    held: int = 0
    failed: int = 0
    parked: int = 0


@dataclass
class LastError:
    seq: int
    event_type: str
    error: str
    updated_at: str


@dataclass
class HealthReport:
    """The log's health, computed from indexed reads only (see the module docstring).

    ``lag_events`` is the distance in sequence numbers from the relay's watermark (the
    highest ``max_seq`` its batches logged) to the newest row: events committed that the
    relay has not yet taken (on PostgreSQL a rolled-back transaction leaves a gap, so it
    can over-count). ``lag_seconds`` is the age (now - logged_at) of the first row above
    the watermark: how long the oldest event the relay has not taken has waited; 0 when
    there is none. ``last_batch_age_seconds`` is now - finished_at of the relay's newest
    batch (None: the relay never logged one).
    """

    counts: dict[str, int] = field(default_factory=dict)
    oldest_age_seconds: dict[str, float] = field(default_factory=dict)
    targets: dict[str, TargetFigures] = field(default_factory=dict)
    unroutable_by_type: dict[str, int] = field(default_factory=dict)
    keys_held_behind_failed: int = 0
    newest_seq: int | None = None
    relayed_seq: int | None = None
    lag_events: int = 0
    lag_seconds: float = 0.0
    last_batch_age_seconds: float | None = None
    last_errors: list[LastError] = field(default_factory=list)

    @property
    def open_events(self) -> int:
        return sum(self.counts.get(s.value, 0) for s in OPEN_STATUSES)

    @property
    def oldest_open_age_seconds(self) -> float | None:
        ages = [
            self.oldest_age_seconds[s.value]
            for s in OPEN_STATUSES
            if s.value in self.oldest_age_seconds
        ]
        return max(ages, default=None)

    def as_json(self) -> dict[str, Any]:
        """The report as ``tidings status --json`` prints it (the operator's guide shows it)."""
        return {
            "counts": {s: self.counts.get(s, 0) for s in NOT_PUBLISHED},
            "open": self.open_events,
            "oldest_age_seconds": self.oldest_age_seconds,
            "oldest_open_age_seconds": self.oldest_open_age_seconds,
            "targets": {name: vars(f) for name, f in sorted(self.targets.items())},
            "unroutable_by_type": self.unroutable_by_type,
            "keys_held_behind_failed": self.keys_held_behind_failed,
            "relay": {
                "newest_seq": self.newest_seq,
                "relayed_seq": self.relayed_seq,
                "lag_events": self.lag_events,
                "lag_seconds": self.lag_seconds,
                "last_batch_age_seconds": self.last_batch_age_seconds,
            },
            "last_errors": [vars(e) for e in self.last_errors],
        }


def health_report(
    engine: Engine, routes: Routes | None = None, *, errors: int = 10
) -> HealthReport:
    """The log's health (see :class:`HealthReport`); ``routes`` give the targets a fresh
    PENDING event still owes (without them only targets named in its deliveries count), and
    ``errors`` how many of the newest FAILED events' errors to list."""
    ensure_schema(engine)
    report = HealthReport()
    oe = outbox_event.c
    now = utcnow()
    with engine.connect() as conn:
        # Grouped by everything the figures need, so the database aggregates: fresh PENDING
        # rows of one type share one group, HELD rows one per blocking event.
        grouped = conn.execute(
            select(
                oe.status,
                oe.event_type,
                oe.deliveries,
                oe.error_details,
                func.count(),
                func.min(oe.logged_at),
            )
            .where(oe.status.in_(NOT_PUBLISHED))
            .group_by(oe.status, oe.event_type, oe.deliveries, oe.error_details)
        )
        for status, event_type, deliveries, error, count, oldest in grouped:
            report.counts[status] = report.counts.get(status, 0) + count
            age = (now - as_utc(oldest)).total_seconds()
            report.oldest_age_seconds[status] = max(age, report.oldest_age_seconds.get(status, 0))
            if status == EventStatus.UNROUTABLE.value:
                report.unroutable_by_type[event_type] = (
                    report.unroutable_by_type.get(event_type, 0) + count
                )
                continue
            _count_targets(report.targets, routes, status, event_type, deliveries, error, count)
        report.keys_held_behind_failed = conn.execute(_KEYS_BEHIND_FAILED).scalar() or 0
        report.newest_seq = conn.execute(select(func.max(oe.seq))).scalar()
        newest_batch = conn.execute(
            select(batch_log.c.max_seq, batch_log.c.finished_at)
            .where(batch_log.c.job == RELAY_JOB)
            .order_by(batch_log.c.max_seq.desc())
            .limit(1)
        ).first()
        if newest_batch is not None:
            report.relayed_seq = newest_batch.max_seq
            report.last_batch_age_seconds = (now - as_utc(newest_batch.finished_at)).total_seconds()
        if report.newest_seq is not None:
            # Housekeeping may have deleted the newest rows the relay took: no lag then.
            report.lag_events = max(0, report.newest_seq - (report.relayed_seq or 0))
            first_waiting = conn.execute(
                select(oe.logged_at)
                .where(oe.seq > (report.relayed_seq or 0))
                .order_by(oe.seq)
                .limit(1)
            ).scalar()
            if first_waiting is not None:
                report.lag_seconds = max(0.0, (now - as_utc(first_waiting)).total_seconds())
        if errors > 0:
            report.last_errors = [
                LastError(seq, etype, err or "", as_utc(updated).isoformat())
                for seq, etype, err, updated in conn.execute(
                    select(oe.seq, oe.event_type, oe.error_details, oe.updated_at)
                    .where(oe.status == EventStatus.FAILED.value)
                    .order_by(oe.updated_at.desc())
                    .limit(errors)
                )
            ]
    return report


def _count_targets(
    targets: dict[str, TargetFigures],
    routes: Routes | None,
    status: str,
    event_type: str,
    deliveries: str | None,
    error: str | None,
    count: int,
) -> None:
    """Add ``count`` events of one group to the figures of every target they still owe."""
    states = json.loads(deliveries) if deliveries else {}
    owed = set(routes.targets_for(event_type)) if routes is not None else set()
    owed |= {name for name, state in states.items() if state.get("state") != "confirmed"}
    owed -= {name for name, state in states.items() if state.get("state") == "confirmed"}
    held = _held_targets(error) if status == EventStatus.HELD.value else set()
    for name in owed:
        figures = targets.setdefault(name, TargetFigures())
        if status == EventStatus.PARKED.value:
            figures.parked += count
        elif _failed_for_good(states.get(name, {})) and name not in held:
            figures.failed += count
        elif name in held:
            figures.held += count
        else:
            figures.pending += count


def _failed_for_good(state: dict[str, Any]) -> bool:
    """Failed past its last try: a failure with a retry to come (``retry_at``) is pending."""
    return state.get("state") == "failed" and "retry_at" not in state


def _held_targets(error: str | None) -> set[str]:
    """The targets a HELD row's ``"<target>: <why>; ..."`` error details name."""
    return {part.split(":", 1)[0].strip() for part in (error or "").split("; ") if ":" in part}


def health_problems(
    report: HealthReport,
    *,
    max_lag: int | None = None,
    max_lag_seconds: float | None = None,
    max_batch_age_seconds: float | None = None,
) -> list[str]:
    """One line per reason the log is unhealthy (``tidings status --check``); a threshold
    that is None is not checked. The batch age counts only while an event has waited for
    the relay longer than it: an idle relay logs no batches, and an event committed a
    moment ago after a quiet hour is no problem yet."""
    problems = []
    for status in (EventStatus.FAILED.value, EventStatus.PARKED.value):
        if count := report.counts.get(status, 0):
            problems.append(
                f"{count} {status} events (oldest {report.oldest_age_seconds[status]:.0f} s)"
            )
    if max_lag is not None and report.lag_events > max_lag:
        problems.append(f"relay lag {report.lag_events} events > {max_lag}")
    if max_lag_seconds is not None and report.lag_seconds > max_lag_seconds:
        problems.append(f"relay lag {report.lag_seconds:.0f} s > {max_lag_seconds:g} s")
    if max_batch_age_seconds is not None and report.lag_seconds > max_batch_age_seconds:
        age = report.last_batch_age_seconds
        if age is None or age > max_batch_age_seconds:
            since = "has never logged a batch" if age is None else f"last batch {age:.0f} s ago"
            problems.append(
                f"relay {since} while {report.lag_events} events wait "
                f"(> {max_batch_age_seconds:g} s)"
            )
    return problems
