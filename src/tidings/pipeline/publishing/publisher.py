"""Delivery of a set of logged events to their targets: the algorithm shared by the
streaming relay and the replay job, run inside Spark tasks.

Guarantees kept here:

* every routed target gets the event; the row becomes PUBLISHED only when all of them
  confirmed (claim 10), and a retry goes only to targets that have not confirmed (claim 8);
* order is kept per (partition key, target): each target gets a key's events in log order,
  one at a time for a non-atomic target, a whole run in one call for an atomic one (it
  confirms or refuses the run as one), a bounded run for one that chains a key's events
  itself (``events_per_key``: each sent once the one before it is confirmed, none after a
  failure). A key whose event waits at one target goes on at the others;
* a failure is charged to the event that caused it alone: a call that fails as a whole is
  split until the failing event is alone, the others are published on the next call and
  are not charged a retry (:class:`~tidings.errors.TargetCallFailed`);
* a failed publish is retried after growing pauses (:mod:`tidings.pipeline.publishing.retry`) while
  the other lanes go on: the event stays PENDING with the reason, its key's later events
  wait for it at that target (HELD), and the retry is sent in this run when it is due soon,
  else by a later run (the relay's carry-over) once it is due. After the last try it is
  FAILED at that target with its retry count and the error (claims 11-12); the relay stops
  there, a replay (``resume_delays`` off) tries it again while under the retry-count
  threshold;
* a target known to be down (:mod:`tidings.pipeline.publishing.breaker`) gets no calls but a probe;
  its events wait (HELD) without being charged, and resume in key order once it is back;
* an event whose type has no route is UNROUTABLE, once, with the reason (claim 6).

This module orders the work: it cuts it into lanes, decides each round what may go and
settles every event from its per-target states. Sending a round, with its retries and
narrowing, is :mod:`tidings.pipeline.publishing.delivery`; the events' state and how it is written
back is :mod:`tidings.pipeline.publishing.outcome`.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from itertools import islice
from typing import Any

from sqlalchemy import Engine

from tidings.config import RetryConfig
from tidings.db import is_mysql
from tidings.events.outbox import OPEN_STATUSES, EventStatus
from tidings.events.timeutil import as_utc, utcnow
from tidings.outbox.schema import OPEN_ROW
from tidings.pipeline.publishing.breaker import breaker_for
from tidings.pipeline.publishing.delivery import BreakerLookup, Delivery, TargetLookup, Unit
from tidings.pipeline.publishing.outcome import (
    CONFIRMED,
    FAILED,
    LATENCY_SAMPLES,
    LoggedEvent,
    Summary,
    record_outcomes,
)
from tidings.pipeline.publishing.retry import IN_RUN_WAIT_S, RetryPolicy
from tidings.routing.table import Routes

#: After a round, outcomes are recorded if the last record is this old (see ``_flush``).
FLUSH_EVERY_S = 1.0
#: The open statuses as members, tested by identity first (an enum member's hash is a
#: Python-level call, and the relay asks for every event).
_OPEN = tuple(OPEN_STATUSES)
_NO_WAITS: dict[str, Any] = {}  # read only


class Publisher:
    """Publishes logged events and records the outcome of every one in the event log."""

    def __init__(
        self,
        engine: Engine,
        routes: Routes,
        targets: TargetLookup,
        retry: RetryPolicy | RetryConfig | Sequence[float],
        *,
        retry_threshold: int | None = None,
        deadline: float | None = None,
        delete_published: bool = False,
        resume_delays: bool = False,
        breakers: BreakerLookup = breaker_for,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.engine = engine
        self.routes = routes
        self.retry = RetryPolicy.of(retry)
        self.retry_threshold = retry_threshold
        self.deadline = deadline
        self.delete_published = delete_published
        self.resume_delays = resume_delays
        self.clock, self.sleep = clock, sleep
        self._delivery = Delivery(targets, self.retry, breakers=breakers, clock=clock)

    # -- one run ---------------------------------------------------------------------------

    def run(self, logged: Iterable[LoggedEvent]) -> Summary:
        """Deliver ``logged`` (any order; re-sorted by seq) and record every outcome."""
        self._summary = summary = Summary()
        self._dirty: list[LoggedEvent] = []
        self._flushed_at = 0.0
        self._waits: dict[int, dict[str, str]] = {}  # id(item) -> target -> why it waits
        self._open_targets: dict[int, set[str]] = {}  # id(item) -> targets still to confirm
        self._due: dict[tuple[str, str], float] = {}  # lane -> when its head may be retried
        self._failed_here: set[tuple[int, str]] = set()  # (id(item), target) failed this run
        self._stopped: set[int] = set()  # id(item) of heads with no try left here
        self._now = utcnow()
        lanes: dict[tuple[str, str], deque[LoggedEvent]] = {}
        work: list[LoggedEvent] = []
        targets_for, open_targets = self.routes.targets_for, self._open_targets
        items = sorted(logged, key=_seq_of)
        summary.events += len(items)
        if items:
            summary.max_seq = max(summary.max_seq, items[-1].event.seq)
        for item in items:
            event = item.event
            if item.status not in _OPEN:
                summary.skipped += 1
                continue
            routed = targets_for(event.event_type)
            if not routed:
                item.settle(EventStatus.UNROUTABLE, f"no route for event type {event.event_type!r}")
                self._dirty.append(item)
                summary.unroutable += 1
                etype = event.event_type
                summary.unroutable_types[etype] = summary.unroutable_types.get(etype, 0) + 1
                continue
            work.append(item)
            if item.deliveries:
                todo = {name for name in routed if not item.confirmed_at(name)}
            else:  # not sent anywhere yet (most rows)
                todo = set(routed)
            open_targets[id(item)] = todo
            key = event.partition_key
            if key is None:
                key = event.ordering_key
            for name in todo:
                lane = lanes.get((key, name))
                if lane is None:
                    lane = lanes[key, name] = deque()
                lane.append(item)
            if not todo:
                self._conclude(item)
        self._flush()  # unroutable rows of this set must not look open to the check below
        limits = self._outside_limits(work)
        while lanes and not self._past_deadline():
            units = self._next_round(lanes, limits)
            if not units:
                if not self._wait_for_a_retry():
                    break
                continue
            self._delivery.deliver(units, summary)
            self._now = utcnow()
            self._after_round(units, lanes)
            self._flush(unless_recent=True)
        # Lanes left over wait for a retry or for a target that is down (past the deadline
        # they stay as they are).
        for lane_id, lane in lanes.items():
            name = lane_id[1]
            if lane_id in self._due:
                self._wait(list(lane)[1:], name, f"held behind unpublished seq {lane[0].event.seq}")
            elif self._delivery.target(name) is not None and self._delivery.breaker(name).is_open:
                self._wait(lane, name, self._delivery.breaker(name).reason())
        for item in work:
            if open_targets[id(item)] and (
                self._waits.get(id(item)) or item.changed or id(item) in self._stopped
            ):
                self._conclude(item)
        self._flush()
        return summary

    # -- ordering --------------------------------------------------------------------------

    def _outside_limits(self, work: list[LoggedEvent]) -> dict[tuple[str, str], int]:
        """Per (key, target): the first earlier open event outside this work set to wait for.

        A work set holds, per key, every open event from its first one on (the source reads
        new rows whole, in chunks in seq order, and a carry-over that would be cut short
        carries no new rows), so only events before a key's first one can be outside it:
        events another run handles, or that wait there.
        """
        first: dict[str, int] = {}
        for item in work:
            if item.event.partition_key is not None:
                first.setdefault(item.event.partition_key, item.event.seq)
        limits: dict[tuple[str, str], int] = {}
        for key, seq, event_type, deliveries in open_rows_before(self.engine, first):
            states = json.loads(deliveries) if deliveries else {}
            for name in self.routes.targets_for(event_type):
                if states.get(name, {}).get("state") != CONFIRMED:
                    lane = (key, name)
                    limits[lane] = min(seq, limits.get(lane, seq))
        return limits

    def _next_round(
        self, lanes: dict[tuple[str, str], deque[LoggedEvent]], limits: dict[tuple[str, str], int]
    ) -> dict[str, list[Unit]]:
        """The next unit of every lane that may go now, grouped by target."""
        units: dict[str, list[Unit]] = {}
        for lane_id in list(lanes):
            key, name = lane_id
            lane = lanes[lane_id]
            head = lane[0]
            behind = limits.get(lane_id)
            if behind is not None and behind < head.event.seq:
                self._wait(lanes.pop(lane_id), name, f"held behind unpublished seq {behind}")
                continue
            failed = head.failed_at(name) or head.status == EventStatus.FAILED
            due = self._retry_due(head, name) if failed else 0.0
            if due is None:
                lanes.pop(lane_id).popleft()  # no try left: settled FAILED at the end
                self._stopped.add(id(head))
                self._wait(lane, name, f"held behind unpublished seq {head.event.seq}")
                continue
            if due > self.clock():
                self._due[lane_id] = due  # other lanes go on meanwhile
                continue
            self._due.pop(lane_id, None)
            target = self._delivery.target(name)
            if target is not None and not self._delivery.breaker(name).allows():
                continue  # waits this round; a probe may reopen the target for later rounds
            take = 1
            if target is not None and target.atomic:
                take = (
                    len(lane)
                    if behind is None
                    else sum(1 for item in lane if item.event.seq < behind)
                )
            elif target is not None and target.events_per_key > 1:
                take = _chain_length(lane, name, behind, target.events_per_key)
            if take == len(lane):  # the whole lane (an atomic target's usual case)
                units.setdefault(name, []).append(Unit(key, list(lane)))
                del lanes[lane_id]
                continue
            units.setdefault(name, []).append(Unit(key, [lane.popleft() for _ in range(take)]))
            if not lane:
                del lanes[lane_id]
        return units

    def _retry_due(self, item: LoggedEvent, name: str) -> float | None:
        """When ``item``, which failed before, may be tried again at ``name`` (epoch
        seconds), or None if not by this run: past the retry-count threshold, or after its
        last try. A replay tries an event that failed in an earlier run at once."""
        if self._over_threshold(item):
            return None
        if not self.resume_delays and (id(item), name) not in self._failed_here:
            return 0.0
        retry_at = item.deliveries.get(name, {}).get("retry_at")
        if isinstance(retry_at, int | float):
            return float(retry_at)
        return None if item.failed_at(name) else 0.0

    def _tries_left(self, item: LoggedEvent, name: str) -> bool:
        return "retry_at" in item.deliveries.get(name, {}) and not self._over_threshold(item)

    def _over_threshold(self, item: LoggedEvent) -> bool:
        return self.retry_threshold is not None and item.retry_count >= self.retry_threshold

    def _wait_for_a_retry(self) -> bool:
        """With nothing to send now: wait for the first retry if it is due soon (and before
        the deadline); False when the run should end instead."""
        if not self._due:
            return False
        pause = max(0.0, min(self._due.values()) - self.clock())
        if pause > IN_RUN_WAIT_S:
            return False
        if self.deadline is not None and time.monotonic() + pause >= self.deadline:
            return False
        self._flush()  # what is settled shows while the run waits
        self.sleep(pause)
        self._now = utcnow()
        return True

    def _after_round(
        self, units: dict[str, list[Unit]], lanes: dict[tuple[str, str], deque[LoggedEvent]]
    ) -> None:
        """Confirmed events move on; a failed or waiting unit stops its lane for this run."""
        open_targets = self._open_targets
        for name, batch in units.items():
            for unit in batch:
                lane_id = (unit.key, name)
                culprit = unit.culprit
                confirmed: list[LoggedEvent] = []
                rest: list[LoggedEvent] = []
                for i in unit.items:
                    if i.confirmed_at(name):
                        confirmed.append(i)
                    elif i is not culprit:
                        rest.append(i)
                if culprit is not None:
                    self._failed_here.add((id(culprit), name))
                if culprit is not None and self._tries_left(culprit, name):
                    # tries are left: the lane goes on from the culprit once its retry is due
                    lanes[lane_id] = deque([culprit, *rest, *lanes.pop(lane_id, ())])
                elif unit.waiting is not None or culprit is not None:
                    held = None if culprit is None else culprit.event.seq
                    reason = unit.waiting or f"held behind unpublished seq {held}"
                    self._wait(rest + list(lanes.pop(lane_id, ())), name, reason)
                elif rest:  # an atomic run cut short by narrowing: the rest goes next round
                    lanes.setdefault(lane_id, deque()).extendleft(reversed(rest))
                for item in confirmed:
                    todo = open_targets[id(item)]
                    todo.discard(name)
                    if not todo:
                        self._conclude(item)

    def _wait(self, items: Iterable[LoggedEvent], name: str, reason: str) -> None:
        for item in items:
            self._waits.setdefault(id(item), {})[name] = reason

    # -- outcome ---------------------------------------------------------------------------

    def _conclude(self, item: LoggedEvent) -> None:
        """Settle ``item`` from its per-target states and queue it for recording."""
        summary = self._summary
        event = item.event
        routed = self.routes.targets_for(event.event_type)
        waits = self._waits.get(id(item), _NO_WAITS)
        deliveries = item.deliveries
        failed: list[str] = []
        for n in routed:  # a loop: a comprehension is a call of its own, once per event
            state = deliveries.get(n)
            if state is not None and state.get("state") == FAILED and n not in waits:
                failed.append(n)
        if failed:
            retrying = {n: deliveries[n] for n in failed if self._tries_left(item, n)}
            failures = {n: deliveries[n].get("error") for n in failed if n not in retrying}
        else:  # the usual case: nothing failed
            retrying = failures = _NO_WAITS
        if failures:
            was_failed = item.status == EventStatus.FAILED
            item.settle(EventStatus.FAILED, json.dumps(failures, ensure_ascii=False))
            if item.changed and not was_failed:  # counted once, not once per replay
                summary.failed += 1
                summary.errors = [*summary.errors, f"seq {item.event.seq}: {failures}"][-20:]
                _count(summary.failed_at, failures, item.event.event_type)
        elif retrying:
            item.settle(EventStatus.PENDING, self._retry_reason(retrying, waits))
        elif waits:
            reason = "; ".join(f"{name}: {why}" for name, why in sorted(waits.items()))
            item.settle(EventStatus.HELD, reason)
            if item.changed:
                summary.held += 1
        elif self._open_targets.get(id(item)):
            pass  # not attempted everywhere before the deadline: progress is recorded as is
        else:
            now = self._now  # one stamp per round, so the round's rows share one UPDATE
            item.published_at = now
            item.settle(EventStatus.PUBLISHED)
            summary.published += 1
            _count(summary.published_to, routed, event.event_type)
            if len(summary.latencies_ms) < LATENCY_SAMPLES * 4:
                delay = (now - as_utc(event.logged_at)).total_seconds() * 1000
                summary.latencies_ms.append(round(delay, 3))
                summary.latency_types.append(event.event_type)
        if item.changed:
            self._dirty.append(item)

    def _retry_reason(self, retrying: dict[str, dict[str, Any]], waits: dict[str, str]) -> str:
        """Why a PENDING event has not gone yet: its retries to come, and its waits."""
        reasons = [
            f"{name}: try {state.get('failures', 1)} of {self.retry.attempts} failed, "
            f"next at {_clock_time(state['retry_at'])}: {state.get('error')}"
            for name, state in sorted(retrying.items())
        ]
        return "; ".join([*reasons, *(f"{name}: {why}" for name, why in sorted(waits.items()))])

    def _flush(self, *, unless_recent: bool = False) -> None:
        """Record the outcome of everything settled so far, in one transaction.

        After a round, only if the last flush is :data:`FLUSH_EVERY_S` old: a non-atomic
        target takes a key's events one per round, so a chunk takes many rounds, and each
        round's rows are spread over the whole chunk; a flush per round rewrote the same
        pages once per round (a third of a JetStream relay's time). A crash before a flush
        loses no event: what is not recorded as confirmed is sent again, and the targets
        drop the duplicate.
        """
        now = time.monotonic()
        if unless_recent and now - self._flushed_at < FLUSH_EVERY_S:
            return
        self._flushed_at = now
        dirty = list({id(i): i for i in self._dirty if i.changed}.values())
        self._dirty = []
        for item in dirty:
            item.changed = False
        record_outcomes(self.engine, dirty, delete_published=self.delete_published)

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def _seq_of(item: LoggedEvent) -> int:
    return item.event.seq


def _chain_length(lane: deque[LoggedEvent], name: str, behind: int | None, limit: int) -> int:
    """How many of ``lane``'s events a target that chains a key's events takes: ``limit`` at
    most, none from ``behind`` on (the key's earlier open event outside this run), and none
    from a later one that failed before (at ``name`` or as a whole), which then goes as a
    head, through the retry and threshold checks. Only the run is looked at, not the lane."""
    for index, item in enumerate(islice(lane, 1, limit), start=1):
        stop = behind is not None and item.event.seq >= behind
        if stop or item.failed_at(name) or item.status == EventStatus.FAILED:
            return index
    return min(limit, len(lane))


def _clock_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def _count(into: dict[str, dict[str, int]], targets: Iterable[str], event_type: str) -> None:
    """One more event of ``event_type`` at each of ``targets``."""
    for name in targets:
        by_type = into.setdefault(name, {})
        by_type[event_type] = by_type.get(event_type, 0) + 1


def open_rows_before(engine: Engine, first: dict[str, int]) -> list[Any]:
    """The open rows of each key in ``first`` before that key's given seq, in one statement.

    The keys and their bounds travel as one parameter (a JSON object on SQLite, two arrays
    on PostgreSQL, a JSON array of pairs on MySQL) and each key is looked up in the open-row
    index: the cost follows the rows found (usually none), not the keys asked for nor the
    size of the log. On SQLite ``CROSS JOIN`` keeps that loop order (its planner would
    otherwise walk the status index once per key: minutes on a large backlog).
    """
    if not first:
        return []
    columns = "o.partition_key, o.seq, o.event_type, o.deliveries"
    open_row = f"o.{OPEN_ROW.text}"
    if engine.dialect.name == "sqlite":
        sql = (
            f"SELECT {columns} FROM json_each(?) AS j CROSS JOIN outbox_event AS o "
            f"ON o.partition_key = j.key AND o.seq < j.value WHERE {open_row}"
        )
        params: tuple[Any, ...] = (json.dumps(first),)
    elif is_mysql(engine.dialect.name):
        # The keys as JSON_TABLE rows; COLLATE matches the log's binary collation, so that
        # the comparison is exact and the open-row index is probed per key.
        sql = (
            f"SELECT {columns} FROM JSON_TABLE(%s, '$[*]' COLUMNS ("
            "k VARCHAR(256) CHARACTER SET utf8mb4 PATH '$[0]', bound BIGINT PATH '$[1]')) AS j "
            "JOIN outbox_event AS o ON o.partition_key = j.k COLLATE utf8mb4_bin "
            f"AND o.seq < j.bound WHERE {open_row}"
        )
        params = (json.dumps(list(first.items())),)
    else:
        # One probe of the open-row index per key: a LATERAL subquery that OFFSET 0 keeps
        # from being flattened into a join. As a plain join PostgreSQL hashed every open
        # row of the log for each chunk (a fresh log has no statistics to say otherwise):
        # a relay draining a backlog read it all again for every chunk.
        sql = (
            f"SELECT {columns} FROM unnest(%s::text[], %s::bigint[]) AS j(key, bound) "
            f"CROSS JOIN LATERAL (SELECT {columns} FROM outbox_event AS o "
            f"WHERE o.partition_key = j.key AND o.seq < j.bound AND {open_row} OFFSET 0) AS o"
        )
        params = (list(first), list(first.values()))
    with engine.connect() as conn:
        return list(conn.exec_driver_sql(sql, params))
