"""Incomplete events, for an operator: find them, resubmit them, park a poison one.

What Spring Modulith's ``IncompleteEventPublications`` offers, on the event log: every
event that is not PUBLISHED (PENDING, HELD, FAILED, PARKED, UNROUTABLE) can be listed with
its per-target state, and selected by status, id, type, target, key and age.

* **Resubmit** hands events back to the relay: status PENDING, retry count 0, and the failed
  state of each target it did not confirm cleared (confirmed targets are never sent it
  again; with a target filter only that target's state is cleared). The running relay picks
  them up with its next carry-over, in key order, as it does any open event below its
  offset; an UNROUTABLE event resubmitted after its route was added is re-driven this way.
* **Park** sets an open event aside with a reason: it no longer counts as open, so the later
  events of its key flow on without it, and nothing deletes it. Unpark resubmits it; it then
  reaches its targets after the later events of its key that flowed meanwhile: parking is
  the operator's decision to let a key go on out of order around one event.

Every change is one conditional UPDATE per event (``WHERE status = <the status it was
found in>``), so an event that moved on in the meantime is left alone and not counted. The
relay in turn never writes a non-PUBLISHED outcome over a PARKED row
(:func:`tidings.pipeline.publishing.outcome.record_outcomes`), so a park is not undone by a
retry that was in flight.

This module sits below routing, so the routes come in as a function (``targets_for``); the
CLI passes the routes in force.
"""

from __future__ import annotations

import contextlib
import heapq
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, bindparam, func, select, text, update
from sqlalchemy.sql.elements import ColumnElement

from tidings.errors import UsageError
from tidings.events.outbox import OPEN_STATUSES, DeliveryState, EventStatus
from tidings.events.timeutil import as_utc, utcnow
from tidings.outbox.schema import OPEN_ROW, SET_ASIDE_ROW, ensure_schema, outbox_event

#: Every status of an event that has not reached all its targets.
INCOMPLETE_STATUSES: frozenset[EventStatus] = frozenset(
    {*OPEN_STATUSES, EventStatus.PARKED, EventStatus.UNROUTABLE}
)
#: What ``resubmit`` takes when no status is named: the events the relay gave up on.
RESUBMIT_DEFAULT: frozenset[EventStatus] = frozenset({EventStatus.FAILED})
_PARKABLE = sorted(s.value for s in OPEN_STATUSES)
_FETCH = 1_000
#: The incomplete events a SQLite page reads through the status index and sorts (above:
#: along the primary key, see :meth:`IncompleteEvents._many`).
_SORT_AT_MOST = 20_000
_WRITE_CHUNK = 1_000
_CONFIRMED = DeliveryState.CONFIRMED.value

RoutedTargets = Callable[[str], Sequence[str]]


@dataclass(frozen=True)
class EventFilter:
    """Which incomplete events an operation applies to; every given criterion must hold.

    ``event_type`` is a type, or a prefix ending in ``*`` (``orders.*``); ``target`` keeps
    the events routed to that target that it has not confirmed; ``older_than`` compares the
    time the event was logged; ``after_seq`` pages through them in log order. Without
    ``statuses``, finding takes every incomplete status
    and resubmitting only FAILED events (a parked or unroutable event is resubmitted only
    when asked for by name).
    """

    statuses: frozenset[EventStatus] | None = None  # None: find all, resubmit FAILED ones
    event_ids: tuple[str, ...] = ()
    event_type: str | None = None
    target: str | None = None
    partition_key: str | None = None
    older_than: timedelta | None = None
    limit: int | None = None
    #: Only events after this ``seq``: the next page of a list paged in log order.
    after_seq: int | None = None

    def __post_init__(self) -> None:
        if self.statuses is None:
            return self._check_bounds()
        wrong = [s for s in self.statuses if s not in INCOMPLETE_STATUSES]
        if wrong or not self.statuses:
            raise UsageError(
                f"status must be one of {', '.join(sorted(INCOMPLETE_STATUSES))}, "
                f"got {', '.join(map(str, wrong)) or 'none'}"
            )
        self._check_bounds()

    def _check_bounds(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"limit must be at least 1, got {self.limit}")
        if self.older_than is not None and self.older_than < timedelta(0):
            raise UsageError(f"older_than must not be negative, got {self.older_than}")


@dataclass(frozen=True)
class TargetState:
    """One routed target's view of an event: ``pending`` until it was tried."""

    state: str
    error: str | None = None
    failures: int = 0


@dataclass(frozen=True)
class IncompleteEvent:
    """An event that has not reached every target, with what each target made of it."""

    seq: int
    event_id: str
    event_type: str
    partition_key: str | None
    status: EventStatus
    retry_count: int
    logged_at: datetime
    reason: str | None
    targets: dict[str, TargetState] = field(default_factory=dict)


@dataclass(frozen=True)
class BlockingEvent:
    """A FAILED event and how many later open events of its key wait behind it."""

    seq: int
    event_id: str
    event_type: str
    partition_key: str
    held: int


class IncompleteEvents:
    """The incomplete events of one event log (the routes say which targets each owes)."""

    def __init__(self, engine: Engine, targets_for: RoutedTargets) -> None:
        self.engine = engine
        self.targets_for = targets_for
        ensure_schema(engine)

    # -- reading ---------------------------------------------------------------------------

    def find(self, where: EventFilter = EventFilter()) -> list[IncompleteEvent]:
        """The matching events in log order (at most ``where.limit``)."""
        return [self._event(row) for row in self._rows(where)]

    def count(self, where: EventFilter = EventFilter()) -> int:
        """How many events match (counted in the database unless a target is named)."""
        if where.target is not None or where.limit is not None:
            return sum(1 for _ in self._rows(where))
        query = select(func.count()).select_from(outbox_event).where(*self._conditions(where))
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    def blocking(self, limit: int = 100) -> list[BlockingEvent]:
        """FAILED events that hold later events of their key, oldest first.

        Spelled with the open-row index's literal condition, so that each probe is an index
        range on (key, seq) rather than a scan of the open rows.
        """
        query = text(
            "SELECT f.seq, f.event_id, f.event_type, f.partition_key, "
            "(SELECT count(*) FROM outbox_event WHERE outbox_event.partition_key = "
            f"f.partition_key AND outbox_event.seq > f.seq AND {OPEN_ROW.text}) AS held "
            "FROM outbox_event f WHERE f.status = 'FAILED' AND f.partition_key IS NOT NULL "
            "AND EXISTS (SELECT 1 FROM outbox_event WHERE outbox_event.partition_key = "
            f"f.partition_key AND outbox_event.seq > f.seq AND {OPEN_ROW.text}) "
            "ORDER BY f.seq LIMIT :limit"
        )
        with self.engine.connect() as conn:
            return [BlockingEvent(*row) for row in conn.execute(query, {"limit": limit})]

    # -- changing --------------------------------------------------------------------------

    def resubmit(self, where: EventFilter = EventFilter()) -> int:
        """Hand the matching events back to the relay (FAILED ones unless the filter names
        statuses); the number resubmitted."""
        changes = []
        for row in self._rows(where, RESUBMIT_DEFAULT):
            states = _states(row.deliveries)
            for name in [where.target] if where.target else list(states):
                if states.get(name, {}).get("state") != _CONFIRMED:
                    states.pop(name, None)
            changes.append(
                {
                    "b_seq": row.seq,
                    "b_was": row.status,
                    "b_status": EventStatus.PENDING.value,
                    "b_error": None,
                    "b_deliveries": json.dumps(states, separators=(",", ":")) if states else None,
                    "b_retries": 0,
                }
            )
        return len(self._apply(changes))

    def park(self, event_ids: Iterable[str], reason: str) -> list[str]:
        """Set the given open events aside; the ids that were parked."""
        reason = reason.strip()
        if not reason:
            raise UsageError("a park needs a reason (say why this event is set aside)")
        ids = _ids(event_ids)
        where = EventFilter(statuses=OPEN_STATUSES, event_ids=ids)
        rows = list(self._rows(where))
        changes = [
            {
                "b_seq": row.seq,
                "b_was": row.status,
                "b_status": EventStatus.PARKED.value,
                "b_error": f"parked: {reason}",
                "b_deliveries": row.deliveries,
                "b_retries": row.retry_count,
            }
            for row in rows
        ]
        done = self._apply(changes)
        return [row.event_id for row in rows if row.seq in done]

    def unpark(self, event_ids: Iterable[str]) -> int:
        """Resubmit the given parked events; the number resubmitted."""
        ids = _ids(event_ids)
        return self.resubmit(EventFilter(statuses=frozenset({EventStatus.PARKED}), event_ids=ids))

    # -- internals -------------------------------------------------------------------------

    def _conditions(
        self, where: EventFilter, statuses: frozenset[EventStatus] = INCOMPLETE_STATUSES
    ) -> list[ColumnElement[bool]]:
        oe = outbox_event.c
        chosen = where.statuses if where.statuses is not None else statuses
        conditions: list[ColumnElement[bool]] = [oe.status.in_(sorted(chosen))]
        if where.event_ids:
            conditions.append(oe.event_id.in_(where.event_ids))
        if where.event_type is not None:
            if where.event_type.endswith("*"):
                prefix = where.event_type[:-1]
                conditions.append(func.substr(oe.event_type, 1, len(prefix)) == prefix)
            else:
                conditions.append(oe.event_type == where.event_type)
        if where.partition_key is not None:
            conditions.append(oe.partition_key == where.partition_key)
        if where.older_than is not None:
            conditions.append(oe.logged_at < utcnow() - where.older_than)
        if where.after_seq is not None:
            conditions.append(oe.seq > where.after_seq)
        return conditions

    def _rows(
        self, where: EventFilter, statuses: frozenset[EventStatus] = INCOMPLETE_STATUSES
    ) -> Iterator[Any]:
        chosen = where.statuses if where.statuses is not None else statuses
        taken = 0
        with contextlib.ExitStack() as connections:
            reads = [
                connections.enter_context(self.engine.connect())
                .execution_options(yield_per=_FETCH)
                .execute(query)
                for query in self._queries(where, chosen)
            ]
            for read in reads:  # each closed before its connection (a partly read one too)
                connections.callback(read.close)
            for row in heapq.merge(*reads, key=lambda row: row.seq):
                if where.target is not None and not self._owes(row, where.target):
                    continue
                yield row
                taken += 1
                if where.limit is not None and taken >= where.limit:
                    return

    def _queries(self, where: EventFilter, chosen: frozenset[EventStatus]) -> list[Any]:
        """The reads of ``where``, each in seq order (:meth:`_rows` merges them).

        A key's open events are read through the partial index on (key, seq) of open rows,
        spelled as it is, so they come in seq order with no sort; its parked and
        unroutable events (which that index does not hold) are one read per status through
        the (key, status, seq) index, in seq order too. Otherwise one read, along the
        primary key when :meth:`_many` says so.
        """
        if where.partition_key is not None:
            open_part = chosen & OPEN_STATUSES
            # idx_04 holds only these rows: its condition, spelled as it is, lets the
            # planners take it (a bound status does not: SQLite's, and PostgreSQL's in a
            # generic plan).
            set_aside = [SET_ASIDE_ROW]
            split: list[tuple[frozenset[EventStatus], list[Any]]] = [
                (frozenset({status}), set_aside) for status in sorted(chosen - open_part)
            ]
            if open_part:
                split.insert(0, (open_part, [OPEN_ROW]))
            return [
                self._query([*self._conditions(replace(where, statuses=part)), *extra])
                for part, extra in split
            ]
        conditions = self._conditions(where, chosen)
        if self._many(where, chosen):
            conditions[0] = (outbox_event.c.status + "").in_(sorted(chosen))
        return [self._query(conditions)]

    @staticmethod
    def _query(conditions: list[Any]) -> Any:
        return select(outbox_event).where(and_(*conditions)).order_by(outbox_event.c.seq)

    def _many(self, where: EventFilter, chosen: frozenset[EventStatus]) -> bool:
        """Should a page of many incomplete events be read in log order on SQLite?

        SQLite's planner, without statistics, reads a status filter through the status
        index and sorts every matching row by ``seq`` before the first page: fine for the
        few incomplete events of a healthy log, most of a second for half a million. When
        the status index counts more than :data:`_SORT_AT_MOST` of them (a count of index
        entries, cheap), the page is read along the primary key instead (the status
        wrapped in an expression, so the index is not chosen), and it stops at the page's
        end. PostgreSQL chooses between the two plans itself, from its statistics.
        """
        if where.limit is None or where.event_ids or self.engine.dialect.name != "sqlite":
            return False
        count = select(func.count()).select_from(outbox_event)
        count = count.where(outbox_event.c.status.in_(sorted(chosen)))
        with self.engine.connect() as conn:
            return int(conn.execute(count).scalar() or 0) > _SORT_AT_MOST

    def _owes(self, row: Any, target: str) -> bool:
        """Is ``target`` routed this event and has not confirmed it?"""
        states = _states(row.deliveries)
        if states.get(target, {}).get("state") == _CONFIRMED:
            return False
        return target in states or target in self.targets_for(row.event_type)

    def _event(self, row: Any) -> IncompleteEvent:
        states = _states(row.deliveries)
        targets = {
            name: TargetState(
                state=states.get(name, {}).get("state", "pending"),
                error=states.get(name, {}).get("error"),
                failures=states.get(name, {}).get("failures", 0),
            )
            for name in dict.fromkeys([*self.targets_for(row.event_type), *states])
        }
        return IncompleteEvent(
            seq=row.seq,
            event_id=row.event_id,
            event_type=row.event_type,
            partition_key=row.partition_key,
            status=EventStatus(row.status),
            retry_count=row.retry_count,
            logged_at=as_utc(row.logged_at),
            reason=row.error_details,
            targets=targets,
        )

    def _apply(self, changes: list[dict[str, Any]]) -> set[int]:
        """Each change only if its row still has the status it was found in; the seqs of the
        rows changed."""
        statement = (
            update(outbox_event)
            .where(outbox_event.c.seq == bindparam("b_seq"))
            .where(outbox_event.c.status == bindparam("b_was"))
            .values(
                status=bindparam("b_status"),
                error_details=bindparam("b_error"),
                deliveries=bindparam("b_deliveries"),
                retry_count=bindparam("b_retries"),
                updated_at=utcnow(),
                concurrency_version=outbox_event.c.concurrency_version + 1,
            )
        )
        done: set[int] = set()
        for start in range(0, len(changes), _WRITE_CHUNK):
            # one transaction per chunk: a resubmit of a million events must not hold
            # SQLite's single writer (and the service's emits) for the whole of it
            with self.engine.begin() as conn:
                for change in changes[start : start + _WRITE_CHUNK]:
                    if conn.execute(statement, change).rowcount:  # this row's own count
                        done.add(change["b_seq"])
        return done


def _states(deliveries: str | None) -> dict[str, dict[str, Any]]:
    return json.loads(deliveries) if deliveries else {}


def _ids(event_ids: Iterable[str]) -> tuple[str, ...]:
    ids = tuple(dict.fromkeys(event_ids))
    if not ids:
        raise UsageError("name at least one event id")
    return ids
