"""Delivery of a set of logged events to their targets: the algorithm shared by the
streaming relay and the replay job, run inside Spark tasks.

Guarantees kept here:

* every routed target gets the event; the row becomes PUBLISHED only when all of them
  confirmed (claim 10), and a retry goes only to targets that have not confirmed (claim 8);
* order is kept per (partition key, target): each target gets a key's events in log order,
  one at a time for a non-atomic target, a whole run in one call for an atomic one (it
  confirms or refuses the run as one). A key whose event waits at one target goes on at
  the others;
* a failure is charged to the event that caused it alone: a call that fails as a whole is
  split until the failing event is alone, the others are published on the next call and
  are not charged a retry (:class:`~tidings.errors.TargetCallFailed`);
* a failed publish is retried after growing intervals, then the event is FAILED at that
  target with its retry count and the error (claims 11-12); the later events of its key
  wait for it at that target (HELD). In a later run it is retried once its pause is over
  (``resume_delays``) and while under the retry-count threshold;
* a target known to be down (:mod:`tidings.pipeline.breaker`) gets no calls but a probe;
  its events wait (HELD) without being charged, and resume in key order once it is back;
* an event whose type has no route is UNROUTABLE, once, with the reason (claim 6).

This module orders the work: it cuts it into lanes, decides each round what may go and
settles every event from its per-target states. Sending a round, with its retries and
narrowing, is :mod:`tidings.pipeline.delivery`; the events' state and how it is written
back is :mod:`tidings.pipeline.outcome`.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import Engine, select

from tidings.events.outbox import OPEN_STATUSES, EventStatus
from tidings.events.timeutil import as_utc, utcnow
from tidings.outbox.schema import OPEN_ROW, outbox_event
from tidings.pipeline.breaker import breaker_for
from tidings.pipeline.delivery import BreakerLookup, Delivery, TargetLookup, Unit
from tidings.pipeline.outcome import (
    CONFIRMED,
    LATENCY_SAMPLES,
    LoggedEvent,
    Summary,
    record_outcomes,
)
from tidings.routing.table import Routes

_KEY_CHUNK = 500
#: Pause before a FAILED event is tried again by a later run: doubles per failed run.
RESUME_FIRST_S = 1.0
RESUME_MAX_S = 30.0


class Publisher:
    """Publishes logged events and records the outcome of every one in the event log."""

    def __init__(
        self,
        engine: Engine,
        routes: Routes,
        targets: TargetLookup,
        backoff: Sequence[float],
        *,
        retry_threshold: int | None = None,
        deadline: float | None = None,
        delete_published: bool = False,
        resume_delays: bool = False,
        breakers: BreakerLookup = breaker_for,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.engine = engine
        self.routes = routes
        self.retry_threshold = retry_threshold
        self.deadline = deadline
        self.delete_published = delete_published
        self.resume_delays = resume_delays
        self._delivery = Delivery(targets, backoff, breakers=breakers, sleep=sleep)

    # -- one run ---------------------------------------------------------------------------

    def run(self, logged: Iterable[LoggedEvent]) -> Summary:
        """Deliver ``logged`` (any order; re-sorted by seq) and record every outcome."""
        self._summary = summary = Summary()
        self._dirty: list[LoggedEvent] = []
        self._waits: dict[int, dict[str, str]] = {}  # id(item) -> target -> why it waits
        self._open_targets: dict[int, set[str]] = {}  # id(item) -> targets still to confirm
        self._now = utcnow()
        lanes: dict[tuple[str, str], deque[LoggedEvent]] = {}
        work: list[LoggedEvent] = []
        for item in sorted(logged, key=lambda e: e.event.seq):
            summary.events += 1
            summary.max_seq = max(summary.max_seq, item.event.seq)
            if item.status not in OPEN_STATUSES:
                summary.skipped += 1
                continue
            routed = self.routes.targets_for(item.event.event_type)
            if not routed:
                item.settle(
                    EventStatus.UNROUTABLE, f"no route for event type {item.event.event_type!r}"
                )
                self._dirty.append(item)
                summary.unroutable += 1
                etype = item.event.event_type
                summary.unroutable_types[etype] = summary.unroutable_types.get(etype, 0) + 1
                continue
            work.append(item)
            todo = {name for name in routed if not item.confirmed_at(name)}
            self._open_targets[id(item)] = todo
            for name in todo:
                lanes.setdefault((item.event.ordering_key, name), deque()).append(item)
            if not todo:
                self._conclude(item)
        self._flush()  # unroutable rows of this set must not look open to the check below
        limits = self._outside_limits(work)
        while lanes and not self._past_deadline():
            units = self._next_round(lanes, limits)
            if not units:
                break
            self._delivery.deliver(units, summary)
            self._now = utcnow()
            self._after_round(units, lanes)
            self._flush()
        # Lanes left over wait for a target that is down (past the deadline they stay as is).
        for (_, name), lane in lanes.items():
            if self._delivery.target(name) is not None and self._delivery.breaker(name).is_open:
                self._wait(lane, name, self._delivery.breaker(name).reason())
        for item in work:
            if self._open_targets[id(item)] and (self._waits.get(id(item)) or item.changed):
                self._conclude(item)
        self._flush()
        return summary

    # -- ordering --------------------------------------------------------------------------

    def _outside_limits(self, work: list[LoggedEvent]) -> dict[tuple[str, str], int]:
        """Per (key, target): the first earlier open event outside this work set to wait for.

        A work set holds, per key, every open event from its first one on (the source reads
        new rows whole, and a carry-over that would be cut short carries no new rows), so
        only events before a key's first one can be outside it: events another run handles,
        or that wait there.
        """
        first: dict[str, int] = {}
        for item in work:
            if item.event.partition_key is not None:
                first.setdefault(item.event.partition_key, item.event.seq)
        limits: dict[tuple[str, str], int] = {}
        keys = list(first)
        for start in range(0, len(keys), _KEY_CHUNK):
            chunk = keys[start : start + _KEY_CHUNK]
            query = select(
                outbox_event.c.partition_key,
                outbox_event.c.seq,
                outbox_event.c.event_type,
                outbox_event.c.deliveries,
            ).where(
                outbox_event.c.partition_key.in_(chunk),
                OPEN_ROW,
                outbox_event.c.seq < max(first[k] for k in chunk),
            )
            with self.engine.connect() as conn:
                for key, seq, event_type, deliveries in conn.execute(query):
                    if seq >= first[key]:
                        continue
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
            if failed and not self._may_retry(head, name):
                lanes.pop(lane_id).popleft()  # stays FAILED as it is
                self._wait(lane, name, f"held behind unpublished seq {head.event.seq}")
                continue
            target = self._delivery.target(name)
            if target is not None and not self._delivery.breaker(name).allows():
                continue  # waits this round; a probe may reopen the target for later rounds
            take = 1
            if target is not None and target.atomic:
                take = sum(1 for item in lane if behind is None or item.event.seq < behind)
            units.setdefault(name, []).append(Unit(key, [lane.popleft() for _ in range(take)]))
            if not lane:
                del lanes[lane_id]
        return units

    def _may_retry(self, item: LoggedEvent, name: str) -> bool:
        """A FAILED event is tried again under the threshold, once its pause is over."""
        if self.retry_threshold is not None and item.retry_count >= self.retry_threshold:
            return False
        if not self.resume_delays:
            return True
        state = item.deliveries.get(name, {})
        pause = min(RESUME_MAX_S, RESUME_FIRST_S * 2 ** max(0, state.get("failures", 1) - 1))
        try:
            failed_at = datetime.fromisoformat(state["at"])
        except (KeyError, TypeError, ValueError):
            return True
        return utcnow() >= as_utc(failed_at) + timedelta(seconds=pause)

    def _after_round(
        self, units: dict[str, list[Unit]], lanes: dict[tuple[str, str], deque[LoggedEvent]]
    ) -> None:
        """Confirmed events move on; a failed or waiting unit stops its lane for this run."""
        for name, batch in units.items():
            for unit in batch:
                lane_id = (unit.key, name)
                rest = [i for i in unit.items if not i.confirmed_at(name) and i is not unit.culprit]
                if unit.waiting is not None or unit.culprit is not None:
                    reason = unit.waiting or f"held behind unpublished seq {unit.culprit.event.seq}"
                    self._wait(rest + list(lanes.pop(lane_id, ())), name, reason)
                elif rest:  # an atomic run cut short by narrowing: the rest goes next round
                    lanes.setdefault(lane_id, deque()).extendleft(reversed(rest))
                for item in unit.items:
                    if item.confirmed_at(name):
                        self._open_targets[id(item)].discard(name)
                        if not self._open_targets[id(item)]:
                            self._conclude(item)

    def _wait(self, items: Iterable[LoggedEvent], name: str, reason: str) -> None:
        for item in items:
            self._waits.setdefault(id(item), {})[name] = reason

    # -- outcome ---------------------------------------------------------------------------

    def _conclude(self, item: LoggedEvent) -> None:
        """Settle ``item`` from its per-target states and queue it for recording."""
        summary = self._summary
        routed = self.routes.targets_for(item.event.event_type)
        failures = {
            name: item.deliveries[name].get("error")
            for name in routed
            if item.failed_at(name) and name not in self._waits.get(id(item), {})
        }
        waits = self._waits.get(id(item), {})
        if failures:
            item.settle(EventStatus.FAILED, json.dumps(failures, ensure_ascii=False))
            if item.changed:
                summary.failed += 1
                summary.errors = [*summary.errors, f"seq {item.event.seq}: {failures}"][-20:]
                _count(summary.failed_at, failures, item.event.event_type)
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
            _count(summary.published_to, routed, item.event.event_type)
            if len(summary.latencies_ms) < LATENCY_SAMPLES * 4:
                delay = (now - as_utc(item.event.logged_at)).total_seconds() * 1000
                summary.latencies_ms.append(round(delay, 3))
                summary.latency_types.append(item.event.event_type)
        if item.changed:
            self._dirty.append(item)

    def _flush(self) -> None:
        """Record the outcome of everything settled so far, in one transaction."""
        dirty, self._dirty = [i for i in self._dirty if i.changed], []
        for item in dirty:
            item.changed = False
        record_outcomes(self.engine, dirty, delete_published=self.delete_published)

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def _count(into: dict[str, dict[str, int]], targets: Iterable[str], event_type: str) -> None:
    """One more event of ``event_type`` at each of ``targets``."""
    for name in targets:
        by_type = into.setdefault(name, {})
        by_type[event_type] = by_type.get(event_type, 0) + 1
