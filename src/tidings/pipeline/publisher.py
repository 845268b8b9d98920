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
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, select

from tidings.db import placeholder
from tidings.errors import TargetCallFailed, TargetUnavailable
from tidings.events.outbox import OPEN_STATUSES, DeliveryState, EventStatus, OutboxEvent
from tidings.events.timeutil import as_utc, driver_stamp, utcnow
from tidings.outbox.schema import OPEN_ROW, outbox_event, outbox_event_attribute
from tidings.pipeline.breaker import CircuitBreaker, breaker_for
from tidings.routing.table import Routes
from tidings.targets.base import Target

TargetLookup = Callable[[str], Target | None]
BreakerLookup = Callable[[Target], CircuitBreaker]
_KEY_CHUNK = 500
_SEQ_CHUNK = 500
_LATENCY_SAMPLES = 512
#: Pause before a FAILED event is tried again by a later run: doubles per failed run.
RESUME_FIRST_S = 1.0
RESUME_MAX_S = 30.0
# Plain strings: reading a member off an enum class costs a descriptor call per event.
_CONFIRMED, _FAILED = DeliveryState.CONFIRMED.value, DeliveryState.FAILED.value
_UPDATE_COLUMNS = (
    "status = {m}, retry_count = {m}, error_details = {m}, deliveries = {m}, "
    "last_publish_at = COALESCE({m}, last_publish_at), updated_at = {m}, "
    "concurrency_version = concurrency_version + 1"
)


def _update_sql(paramstyle: str, rows: int) -> str:
    mark = placeholder(paramstyle)
    seqs = ", ".join([mark] * rows)
    return f"UPDATE outbox_event SET {_UPDATE_COLUMNS.format(m=mark)} WHERE seq IN ({seqs})"


def _outcome_groups(items: Iterable[LoggedEvent]) -> dict[tuple[Any, ...], list[int]]:
    """Seqs grouped by identical outcome: a batch mostly shares one, so few UPDATEs do it.

    Delivery states are keyed by their content (cheaper than encoding each to JSON), and
    each distinct one is encoded once by the caller.
    """
    groups: dict[tuple[Any, ...], list[int]] = {}
    for item in items:
        key = (
            item.status.value,
            item.retry_count,
            item.error_details,
            tuple((name, tuple(d.items())) for name, d in item.deliveries.items()),
            item.published_at,
        )
        groups.setdefault(key, []).append(item.event.seq)
    return groups


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
        return self.deliveries.get(target, {}).get("state") == _CONFIRMED

    def failed_at(self, target: str) -> bool:
        return self.deliveries.get(target, {}).get("state") == _FAILED

    def settle(self, status: EventStatus, error: str | None = None) -> None:
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

    def merge(self, other: Summary) -> None:
        for name in ("events", "published", "failed", "held", "unroutable", "skipped", "retries"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_seq = max(self.max_seq, other.max_seq)
        self.latencies_ms.extend(other.latencies_ms)
        self.errors = (self.errors + other.errors)[-20:]

    def as_dict(self) -> dict[str, object]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["latencies_ms"] = self.latencies_ms[:_LATENCY_SAMPLES]
        return data


@dataclass(eq=False)
class _Unit:
    """What one (key, target) lane sends in one round: one event, or a run for atomic targets.

    ``culprit`` is the event that failed on its own (the unit's later events wait behind it);
    ``waiting`` is set when the target was unavailable and nothing was charged.
    """

    key: str
    items: list[LoggedEvent]
    culprit: LoggedEvent | None = None
    error: str | None = None
    waiting: str | None = None


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
        self._lookup = targets
        self._targets: dict[str, Target | None] = {}
        self.backoff = list(backoff)
        self.retry_threshold = retry_threshold
        self.deadline = deadline
        self.delete_published = delete_published
        self.resume_delays = resume_delays
        self._breakers = breakers
        self._breaker_of: dict[str, CircuitBreaker] = {}  # looked up once per name
        self.sleep = sleep
        self._lock = threading.Lock()

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
            self._deliver(units)
            self._now = utcnow()
            self._after_round(units, lanes)
            self._flush()
        # Lanes left over wait for a target that is down (past the deadline they stay as is).
        for (_, name), lane in lanes.items():
            if self.targets(name) is not None and self._breaker(name).is_open:
                self._wait(lane, name, self._breaker(name).reason())
        for item in work:
            if self._open_targets[id(item)] and (self._waits.get(id(item)) or item.changed):
                self._conclude(item)
        self._flush()
        return summary

    def targets(self, name: str) -> Target | None:
        """The target called ``name``, looked up once per run."""
        if name not in self._targets:
            self._targets[name] = self._lookup(name)
        return self._targets[name]

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
                        if states.get(name, {}).get("state") != _CONFIRMED:
                            lane = (key, name)
                            limits[lane] = min(seq, limits.get(lane, seq))
        return limits

    def _next_round(
        self, lanes: dict[tuple[str, str], deque[LoggedEvent]], limits: dict[tuple[str, str], int]
    ) -> dict[str, list[_Unit]]:
        """The next unit of every lane that may go now, grouped by target."""
        units: dict[str, list[_Unit]] = {}
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
            target = self.targets(name)
            if target is not None and not self._breaker(name).allows():
                continue  # waits this round; a probe may reopen the target for later rounds
            take = 1
            if target is not None and target.atomic:
                take = sum(1 for item in lane if behind is None or item.event.seq < behind)
            units.setdefault(name, []).append(_Unit(key, [lane.popleft() for _ in range(take)]))
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
        self, units: dict[str, list[_Unit]], lanes: dict[tuple[str, str], deque[LoggedEvent]]
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

    # -- delivery --------------------------------------------------------------------------

    def _deliver(self, units: dict[str, list[_Unit]]) -> None:
        """Send every target's units (targets in parallel), with retries and narrowing."""
        if len(units) == 1:
            self._deliver_to(*next(iter(units.items())))
            return
        with ThreadPoolExecutor(max_workers=len(units)) as pool:
            list(pool.map(lambda kv: self._deliver_to(*kv), units.items()))

    def _deliver_to(self, name: str, units: list[_Unit]) -> None:
        """Try, then retry the failing events alone after growing pauses; then FAILED.

        Sending again an event that failed in an earlier run counts as a retry too.
        """
        again = {id(u.items[0]) for u in units if u.items[0].failed_at(name)}
        failing = self._try(name, units)
        for unit in units:
            if unit.waiting is None and id(unit.items[0]) in again:
                self._charge(unit.items[0])
        for pause in self.backoff:
            if not failing:
                break
            self.sleep(pause)
            retried = [_Unit(u.key, [u.culprit]) for u in failing]  # type: ignore[list-item]
            still = {id(u.items[0]) for u in self._try(name, retried)}
            waiting = {id(r.items[0]): r.waiting for r in retried if r.waiting is not None}
            for unit in failing:
                culprit = unit.culprit
                assert culprit is not None
                if id(culprit) in waiting:  # the target went down: no retry is charged
                    unit.culprit, unit.waiting = None, waiting[id(culprit)]
                    continue
                self._charge(culprit)
                if id(culprit) not in still:
                    unit.culprit = None  # confirmed: its followers go in the next round
            failing = [u for u in failing if u.culprit is not None]
        now = utcnow().isoformat()
        for unit in failing:
            culprit = unit.culprit
            assert culprit is not None
            with self._lock:
                failures = culprit.deliveries.get(name, {}).get("failures", 0) + 1
                culprit.deliveries[name] = {
                    "state": _FAILED,
                    "error": unit.error,
                    "at": now,
                    "failures": failures,
                }
                culprit.changed = True

    def _charge(self, item: LoggedEvent) -> None:
        with self._lock:
            item.retry_count += 1
            item.changed = True
            self._summary.retries += 1

    def _try(self, name: str, units: list[_Unit]) -> list[_Unit]:
        """One call with ``units``; the units whose culprit failed on its own are returned.

        A call that fails as a whole is narrowed: split in halves, each tried alone, until a
        failing unit is alone; an atomic run alone is split the same way (its halves in log
        order, the second only after the first was confirmed).
        """
        target = self.targets(name)
        items = [item for unit in units for item in unit.items]
        if target is None:
            error = f"unknown target {name!r}: not defined in the configuration"
            return self._blame(units, error)
        breaker = self._breaker(name)
        try:
            results = target.publish([item.event for item in items])
        except TargetUnavailable as exc:
            breaker.failed(str(exc), {u.key for u in units}, unavailable=True)
            for unit in units:
                unit.waiting = breaker.reason()
            return []
        except Exception as exc:  # a target must not take the relay down
            error = str(exc) if isinstance(exc, TargetCallFailed) else _describe(name, exc)
            confirmed = exc.confirmed if isinstance(exc, TargetCallFailed) else []
            if len(confirmed) == len(items):
                self._confirm(name, [i for i, ok in zip(items, confirmed, strict=True) if ok])
            return self._narrow(name, units, error)
        self._confirm(name, [i for i, r in zip(items, results, strict=True) if r is None])
        errors = dict(zip(map(id, items), results, strict=True))
        failing: list[_Unit] = []
        for unit in units:
            culprit = next((i for i in unit.items if errors[id(i)] is not None), None)
            if culprit is not None:
                unit.culprit, unit.error = culprit, errors[id(culprit)]
                failing.append(unit)
        if len(failing) < len(units):
            breaker.succeeded()
        elif failing:
            breaker.failed(failing[0].error or "", {u.key for u in failing})
        return failing

    def _narrow(self, name: str, units: list[_Unit], error: str) -> list[_Unit]:
        """Split a call that failed as a whole; each part is tried alone (see :meth:`_try`).

        The parts are new units of what is still unconfirmed; their outcome is copied back
        to the units of the call at the end.
        """
        parts = [(_Unit(u.key, [i for i in u.items if not i.confirmed_at(name)]), u) for u in units]
        parts = [(part, unit) for part, unit in parts if part.items]
        if len(parts) == 1 and len(parts[0][0].items) == 1:  # found: the event failed alone
            self._breaker(name).failed(error, {parts[0][0].key})
            self._blame([parts[0][0]], error)
        elif len(parts) == 1:  # one atomic run: its first half, then the rest if that went
            part = parts[0][0]
            half = len(part.items) // 2
            for piece in (part.items[:half], part.items[half:]):
                sub = _Unit(part.key, piece)
                self._try(name, [sub])
                part.culprit, part.error, part.waiting = sub.culprit, sub.error, sub.waiting
                if sub.culprit is not None or sub.waiting is not None:
                    break
        else:
            half = len(parts) // 2
            self._try(name, [part for part, _ in parts[:half]])
            if any(part.waiting is not None for part, _ in parts[:half]):
                for part, _ in parts[half:]:  # the target went down: the rest waits
                    part.waiting = self._breaker(name).reason()
            else:
                self._try(name, [part for part, _ in parts[half:]])
        for part, unit in parts:
            unit.culprit, unit.error, unit.waiting = part.culprit, part.error, part.waiting
        return [unit for part, unit in parts if part.culprit is not None]

    def _blame(self, units: list[_Unit], error: str) -> list[_Unit]:
        for unit in units:
            unit.culprit, unit.error = unit.items[0], error
        return units

    def _confirm(self, name: str, items: list[LoggedEvent]) -> None:
        now = utcnow().isoformat()
        with self._lock:
            for item in items:
                item.deliveries[name] = {"state": _CONFIRMED, "at": now}
                item.changed = True

    def _breaker(self, name: str) -> CircuitBreaker:
        breaker = self._breaker_of.get(name)
        if breaker is None:
            target = self.targets(name)
            assert target is not None, "only defined targets have a breaker"
            breaker = self._breaker_of[name] = self._breakers(target)
        return breaker

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
            if len(summary.latencies_ms) < _LATENCY_SAMPLES * 4:
                delay = (now - as_utc(item.event.logged_at)).total_seconds() * 1000
                summary.latencies_ms.append(round(delay, 3))
        if item.changed:
            self._dirty.append(item)

    def _flush(self) -> None:
        """Record the outcome of everything settled so far, in one transaction."""
        dirty, self._dirty = [i for i in self._dirty if i.changed], []
        for item in dirty:
            item.changed = False
        done = [i for i in dirty if self.delete_published and i.status == EventStatus.PUBLISHED]
        if done:
            dirty = [i for i in dirty if i.status != EventStatus.PUBLISHED]
        if not (dirty or done):
            return
        stamp = driver_stamp(self.engine.dialect.name)
        now = stamp(utcnow())
        style = self.engine.dialect.paramstyle
        with self.engine.begin() as conn:
            for (status, retries, error, deliveries, published), seqs in _outcome_groups(
                dirty
            ).items():
                values = (
                    status,
                    retries,
                    error,
                    json.dumps({n: dict(d) for n, d in deliveries}, separators=(",", ":")),
                    None if published is None else stamp(published),
                    now,
                )
                for start in range(0, len(seqs), _SEQ_CHUNK):
                    chunk = seqs[start : start + _SEQ_CHUNK]
                    conn.exec_driver_sql(_update_sql(style, len(chunk)), (*values, *chunk))
            for start in range(0, len(done), _SEQ_CHUNK):  # the design document's
                chunk = done[start : start + _SEQ_CHUNK]  # delete-on-success mode
                conn.execute(
                    delete(outbox_event_attribute).where(
                        outbox_event_attribute.c.event_id.in_([i.event.event_id for i in chunk])
                    )
                )
                conn.execute(
                    delete(outbox_event).where(outbox_event.c.seq.in_([i.event.seq for i in chunk]))
                )

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def _describe(name: str, exc: BaseException) -> str:
    return f"target {name!r} raised {type(exc).__name__}: {exc}"
