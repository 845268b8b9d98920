"""What a publishing run knows of each event, what it did, and how it writes that back.

A :class:`LoggedEvent` is an event with its publication state as the event log holds it (its
status, retry count and per-target delivery states); the publisher changes these in memory
and :func:`record_outcomes` writes the changed ones back in one transaction. A
:class:`Summary` is what one Spark task did, sent to the driver in its commit message.

Kept apart from the delivery algorithm (:mod:`tidings.pipeline.publishing.publisher`)
because this is the shape of the data and the SQL that stores it: the replay and relay
drivers read the summaries without the algorithm, and the UPDATEs are tuned here (one per
distinct outcome).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from tidings.db import driver_stamp, is_mysql, placeholder
from tidings.events.outbox import DeliveryState, EventStatus, OutboxEvent
from tidings.events.timeutil import utcnow
from tidings.outbox.confirmations import newest_confirmations, raise_marks
from tidings.redaction import scrub

# Plain strings: reading a member off an enum class costs a descriptor call per event.
CONFIRMED, FAILED = DeliveryState.CONFIRMED.value, DeliveryState.FAILED.value
_PUBLISHED, _PARKED = EventStatus.PUBLISHED.value, EventStatus.PARKED.value
_VALUES = {status: status.value for status in EventStatus}
#: Latencies a summary carries to the driver (a run samples up to four times as many).
LATENCY_SAMPLES = 512
_UPDATE_COLUMNS = (
    "status = {m}, retry_count = {m}, error_details = {m}, deliveries = {m}, "
    "last_publish_at = COALESCE({m}, last_publish_at), updated_at = {m}, "
    "concurrency_version = concurrency_version + 1"
)


@dataclass(slots=True)
class LoggedEvent:
    """An event with its publication state as stored in the log."""

    event: OutboxEvent
    status: EventStatus
    retry_count: int = 0
    deliveries: dict[str, dict[str, Any]] = field(default_factory=dict)
    error_details: str | None = None
    published_at: datetime | None = None
    changed: bool = False

    def confirmed_at(self, target: str) -> bool:
        return self.deliveries.get(target, {}).get("state") == CONFIRMED

    def failed_at(self, target: str) -> bool:
        return self.deliveries.get(target, {}).get("state") == FAILED

    def settle(self, status: EventStatus, error: str | None = None) -> None:
        # A target's error may quote its URL: no password goes into the log's rows.
        error = None if error is None else scrub(error)
        if (status, error) != (self.status, self.error_details):
            self.status, self.error_details, self.changed = status, error, True


@dataclass
class Summary:
    """What one task did; travels to the driver in the Spark commit message."""

    events: int = 0
    published: int = 0
    failed: int = 0
    held: int = 0
    unroutable: int = 0
    skipped: int = 0
    retries: int = 0
    max_seq: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Per target, per event type: events that became PUBLISHED (counted at each routed
    #: target) and events that became FAILED at that target. The metrics' labels.
    published_to: dict[str, dict[str, int]] = field(default_factory=dict)
    failed_at: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Event type -> events found UNROUTABLE.
    unroutable_types: dict[str, int] = field(default_factory=dict)
    #: The event type of each ``latencies_ms`` sample, in the same order.
    latency_types: list[str] = field(default_factory=list)

    def merge(self, other: Summary) -> None:
        for name in ("events", "published", "failed", "held", "unroutable", "skipped", "retries"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_seq = max(self.max_seq, other.max_seq)
        self.latencies_ms.extend(other.latencies_ms)
        self.latency_types.extend(other.latency_types)
        self.errors = (self.errors + other.errors)[-20:]
        for mine, theirs in (
            (self.published_to, other.published_to),
            (self.failed_at, other.failed_at),
        ):
            for target, by_type in theirs.items():
                add_counts(mine.setdefault(target, {}), by_type)
        add_counts(self.unroutable_types, other.unroutable_types)

    def as_dict(self) -> dict[str, object]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["latencies_ms"] = self.latencies_ms[:LATENCY_SAMPLES]
        data["latency_types"] = self.latency_types[:LATENCY_SAMPLES]
        return data


def add_counts(into: dict[str, int], counts: dict[str, int]) -> None:
    """Add ``counts`` to ``into``, key by key."""
    for key, count in counts.items():
        into[key] = into.get(key, 0) + count


def record_outcomes(engine: Engine, settled: list[LoggedEvent], *, delete_published: bool) -> None:
    """Write the state of ``settled`` events to the log, in one transaction.

    With ``delete_published`` (the design document's delete-on-success mode) a PUBLISHED
    event and its attributes are deleted instead. Each target's mark (its newest
    confirmation, :mod:`tidings.outbox.confirmations`) is raised in the same transaction.
    """
    done = [i for i in settled if delete_published and i.status == EventStatus.PUBLISHED]
    if done:
        settled = [i for i in settled if i.status != EventStatus.PUBLISHED]
    if not (settled or done):
        return
    dialect = engine.dialect.name
    stamp = driver_stamp(dialect)
    now = stamp(utcnow())
    mark = placeholder(engine.dialect.paramstyle)
    groups = _outcome_groups(settled)
    # From the groups' delivery states (a flush has few), not from every event's.
    confirmed = newest_confirmations(
        [((name, dict(state)) for name, state in key[3]) for key in groups]
        + [item.deliveries.items() for item in done]
    )
    with engine.begin() as conn:
        for (status, retries, error, deliveries, published), seqs in groups.items():
            values = (
                status,
                retries,
                error,
                json.dumps({n: dict(d) for n, d in deliveries}, separators=(",", ":")),
                None if published is None else stamp(published),
                now,
                _seq_array(dialect, seqs),
            )
            conn.exec_driver_sql(
                _update_sql(dialect, mark, over_parked=status == _PUBLISHED), values
            )
        if done:
            rows = _seq_rows(dialect, mark)
            done_seqs = (_seq_array(dialect, [i.event.seq for i in done]),)
            conn.exec_driver_sql(_delete_attributes_sql(dialect, rows), done_seqs)
            conn.exec_driver_sql(f"DELETE FROM outbox_event WHERE {rows}", done_seqs)
        raise_marks(conn, confirmed)  # last: the rows above are this task's alone


def _delete_attributes_sql(dialect: str, rows: str) -> str:
    """The attributes of the events in ``rows`` (:func:`_seq_rows`). MySQL as a join: its
    planner runs ``IN (subquery)`` in a DELETE once per attribute row."""
    if is_mysql(dialect):
        return (
            "DELETE a FROM outbox_event_attribute AS a JOIN outbox_event "
            f"ON a.event_id = outbox_event.event_id WHERE outbox_event.{rows}"
        )
    return (
        "DELETE FROM outbox_event_attribute WHERE event_id IN "
        f"(SELECT event_id FROM outbox_event WHERE {rows})"
    )


def _update_sql(dialect: str, mark: str, *, over_parked: bool) -> str:
    """The UPDATE of one outcome group: one statement whatever its size, the group's seqs
    passed as one parameter (a JSON array on SQLite, an array on PostgreSQL).

    Set-based because per-row parameters cost: SQLite took 56 us a row with ``seq IN`` lists
    of 500 marks (its planner may walk the status index for each statement) against 15 us
    here. The status guard is written ``+status`` on SQLite so that the planner looks rows
    up by seq, not by the status index (a walk over every open row per statement).

    A failure or a wait never overwrites a PUBLISHED row (another run, a replay beside the
    relay, delivered it meanwhile: this run's copy is stale) nor a PARKED one (an operator
    set it aside while this run had it in hand; the key would be held again). A PUBLISHED
    outcome may overwrite a park: it was delivered."""
    status = "+status" if dialect == "sqlite" else "status"
    guard = "" if over_parked else f" AND {status} NOT IN ('{_PARKED}', '{_PUBLISHED}')"
    rows = _seq_rows(dialect, mark)
    return f"UPDATE outbox_event SET {_UPDATE_COLUMNS.format(m=mark)} WHERE {rows}{guard}"


def _seq_rows(dialect: str, mark: str) -> str:
    """The rows whose seq is in the one array parameter ``mark`` (see :func:`_seq_array`)."""
    if dialect == "sqlite":
        return f"seq IN (SELECT value FROM json_each({mark}))"
    if is_mysql(dialect):
        # PyMySQL writes a tuple parameter as a parenthesised list: a primary-key range.
        # (An IN over a JSON_TABLE subquery is planned as a scan of the whole log.)
        return f"seq IN {mark}"
    return f"seq = ANY({mark})"


def _seq_array(dialect: str, seqs: list[int]) -> str | list[int] | tuple[int, ...]:
    """``seqs`` as one parameter: a JSON array for SQLite's ``json_each``, a tuple for
    PyMySQL, else a list (psycopg sends it as an array)."""
    if dialect == "sqlite":
        return json.dumps(seqs)
    return tuple(int(seq) for seq in seqs) if is_mysql(dialect) else seqs


def _outcome_groups(items: Iterable[LoggedEvent]) -> dict[tuple[Any, ...], list[int]]:
    """Seqs grouped by identical outcome: a batch mostly shares one, so few UPDATEs do it.

    Delivery states are keyed by their content (cheaper than encoding each to JSON), and
    each distinct one is encoded once by the caller. A state object is often shared by the
    events of one call (:meth:`Delivery._confirm
    <tidings.pipeline.publishing.delivery.Delivery._confirm>`): its content is taken once.
    """
    groups: dict[tuple[Any, ...], list[int]] = {}
    contents: dict[int, tuple[Any, ...]] = {}  # id(state) -> its items (all alive meanwhile)
    for item in items:
        states = []
        for name, state in item.deliveries.items():
            content = contents.get(id(state))
            if content is None:
                content = contents[id(state)] = tuple(state.items())
            states.append((name, content))
        key = (
            _VALUES[item.status],
            item.retry_count,
            item.error_details,
            tuple(states),
            item.published_at,
        )
        group = groups.get(key)
        if group is None:
            group = groups[key] = []
        group.append(item.event.seq)
    return groups
