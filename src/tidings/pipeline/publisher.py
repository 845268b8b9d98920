"""Delivery of a set of logged events to their targets: the algorithm shared by the
streaming relay and the replay job, run inside Spark tasks.

Guarantees kept here:

* every routed target gets the event; the row becomes PUBLISHED only when all of them
  confirmed (claim 10), and a retry goes only to targets that have not confirmed (claim 8);
* a failed publish is retried after growing intervals, then the row is FAILED with its
  retry count and the error per target (claims 11-12);
* events of one partition key reach each target in log order: the work proceeds in
  *rounds*, a key contributes its next event to a round only after its previous one was
  confirmed everywhere, and a key whose earlier event is still unpublished is held
  (status HELD) while other keys go on. Atomic targets (one transaction per call) may get
  a key's whole run in one call, because they confirm or refuse it as one;
* an event whose type has no route is UNROUTABLE, once, with the reason (claim 6).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, delete, func, select

from tidings.db import placeholder
from tidings.model import OPEN_STATUSES, DeliveryState, EventStatus, OutboxEvent
from tidings.outbox.schema import OPEN_ROW, outbox_event, outbox_event_attribute
from tidings.routing.table import Routes
from tidings.targets.base import Target
from tidings.timeutil import as_utc, driver_stamp, utcnow

TargetLookup = Callable[[str], Target | None]
_KEY_CHUNK = 500
_LATENCY_SAMPLES = 512
_UPDATE_COLUMNS = (
    "status = {m}, retry_count = {m}, error_details = {m}, deliveries = {m}, "
    "last_publish_at = COALESCE({m}, last_publish_at), updated_at = {m}, "
    "concurrency_version = concurrency_version + 1"
)


_SEQ_CHUNK = 500


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
    deliveries: dict[str, dict[str, str]] = field(default_factory=dict)
    error_details: str | None = None
    published_at: datetime | None = None
    changed: bool = False

    def confirmed_at(self, target: str) -> bool:
        return self.deliveries.get(target, {}).get("state") == DeliveryState.CONFIRMED

    def settle(self, status: EventStatus, error: str | None = None) -> None:
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
        self.sleep = sleep

    def run(self, logged: Iterable[LoggedEvent]) -> Summary:
        """Deliver ``logged`` (any order; re-sorted by seq) and record every outcome."""
        summary = Summary()
        self._dirty: list[LoggedEvent] = []
        queues: dict[str, deque[LoggedEvent]] = {}
        for item in sorted(logged, key=lambda e: e.event.seq):
            summary.events += 1
            summary.max_seq = max(summary.max_seq, item.event.seq)
            if item.status not in OPEN_STATUSES:
                summary.skipped += 1
            elif not self.routes.targets_for(item.event.event_type):
                item.settle(
                    EventStatus.UNROUTABLE, f"no route for event type {item.event.event_type!r}"
                )
                self._dirty.append(item)
                summary.unroutable += 1
            else:
                queues.setdefault(item.event.ordering_key, deque()).append(item)
        self._flush()  # unroutable rows of this set must not look open to the check below
        self._hold_blocked_keys(queues, summary)
        self._flush()
        while queues and not self._past_deadline():
            round_items = self._next_round(queues, summary)
            if round_items:
                self._deliver(round_items, summary)
                self._conclude_round(round_items, queues, summary)
                self._dirty.extend(round_items)
            self._flush()
        return summary

    def targets(self, name: str) -> Target | None:
        """The target called ``name``, looked up once per run."""
        if name not in self._targets:
            self._targets[name] = self._lookup(name)
        return self._targets[name]

    def _flush(self) -> None:
        """Record the outcome of everything settled so far, in one transaction."""
        dirty, self._dirty = [i for i in self._dirty if i.changed], []
        done = [i for i in dirty if self.delete_published and i.status == EventStatus.PUBLISHED]
        if done:
            dirty = [i for i in dirty if i.status != EventStatus.PUBLISHED]
        stamp = driver_stamp(self.engine.dialect.name)
        now = stamp(utcnow())
        style = self.engine.dialect.paramstyle
        if dirty or done:
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
                if done:  # the design document's delete-on-success completion mode
                    for start in range(0, len(done), _SEQ_CHUNK):
                        chunk = done[start : start + _SEQ_CHUNK]
                        conn.execute(
                            delete(outbox_event_attribute).where(
                                outbox_event_attribute.c.event_id.in_(
                                    [i.event.event_id for i in chunk]
                                )
                            )
                        )
                        conn.execute(
                            delete(outbox_event).where(
                                outbox_event.c.seq.in_([i.event.seq for i in chunk])
                            )
                        )

    # -- ordering --------------------------------------------------------------------------

    def _hold_blocked_keys(self, queues: dict[str, deque[LoggedEvent]], summary: Summary) -> None:
        """Hold every key that has an earlier open event outside this work set."""
        firsts = {
            q[0].event.partition_key: q[0].event.seq
            for q in queues.values()
            if q[0].event.partition_key is not None
        }
        keys = list(firsts)
        for start in range(0, len(keys), _KEY_CHUNK):
            chunk = keys[start : start + _KEY_CHUNK]
            query = (
                select(outbox_event.c.partition_key, func.min(outbox_event.c.seq))
                .where(outbox_event.c.partition_key.in_(chunk), OPEN_ROW)
                .group_by(outbox_event.c.partition_key)
            )
            with self.engine.connect() as conn:
                for key, earliest in conn.execute(query):
                    if earliest < firsts[key]:
                        self._hold_rest(queues.pop(key), earliest, summary)

    def _hold_rest(self, queue: Iterable[LoggedEvent], behind: int, summary: Summary) -> None:
        for item in queue:
            item.settle(EventStatus.HELD, f"held behind unpublished seq {behind} of its key")
            self._dirty.append(item)
            summary.held += 1

    def _next_round(
        self, queues: dict[str, deque[LoggedEvent]], summary: Summary
    ) -> list[LoggedEvent]:
        """The next event of every key (a whole run where all its targets are atomic)."""
        round_items: list[LoggedEvent] = []
        for key in list(queues):
            queue = queues[key]
            head = queue[0]
            if self._over_threshold(head):
                self._hold_rest(list(queue)[1:], head.event.seq, summary)
                del queues[key]
                continue
            take = len(queue) if self._all_atomic(queue) else 1
            round_items.extend(queue.popleft() for _ in range(take))
            if not queue:
                del queues[key]
        return round_items

    def _over_threshold(self, item: LoggedEvent) -> bool:
        return (
            self.retry_threshold is not None
            and item.status == EventStatus.FAILED
            and item.retry_count >= self.retry_threshold
        )

    def _all_atomic(self, queue: Iterable[LoggedEvent]) -> bool:
        for item in queue:
            for name in self.routes.targets_for(item.event.event_type):
                target = self.targets(name)
                if target is None or not target.atomic:
                    return False
        return True

    # -- delivery --------------------------------------------------------------------------

    def _deliver(self, items: list[LoggedEvent], summary: Summary) -> None:
        """Publish to every unconfirmed target, retrying failures with growing intervals."""
        errors: dict[tuple[int, str], str] = {}
        pending = [
            (item, name)
            for item in items
            for name in self.routes.targets_for(item.event.event_type)
            if not item.confirmed_at(name)
        ]
        for attempt in range(len(self.backoff) + 1):
            if attempt:
                self.sleep(self.backoff[attempt - 1])
                retried = {id(item) for item, _ in pending}
                for item in items:
                    if id(item) in retried:
                        item.retry_count += 1
                        summary.retries += 1
            pending = self._attempt(pending, errors)
            if not pending:
                break
        now = utcnow().isoformat()
        for item, name in pending:
            item.deliveries[name] = {
                "state": DeliveryState.FAILED,
                "error": errors[(id(item), name)],
                "at": now,
            }

    def _attempt(
        self, pending: list[tuple[LoggedEvent, str]], errors: dict[tuple[int, str], str]
    ) -> list[tuple[LoggedEvent, str]]:
        by_target: dict[str, list[LoggedEvent]] = {}
        for item, name in pending:
            by_target.setdefault(name, []).append(item)
        if len(by_target) == 1:
            results = [self._publish_to(*next(iter(by_target.items())))]
        else:
            with ThreadPoolExecutor(max_workers=len(by_target)) as pool:
                results = list(pool.map(lambda kv: self._publish_to(*kv), by_target.items()))
        still: list[tuple[LoggedEvent, str]] = []
        now = utcnow().isoformat()
        for (name, batch), outcome in zip(by_target.items(), results, strict=True):
            for item, error in zip(batch, outcome, strict=True):
                if error is None:
                    item.deliveries[name] = {"state": DeliveryState.CONFIRMED, "at": now}
                    item.changed = True
                else:
                    errors[(id(item), name)] = error
                    still.append((item, name))
        return still

    def _publish_to(self, name: str, items: list[LoggedEvent]) -> list[str | None]:
        target = self.targets(name)
        if target is None:
            return [f"unknown target {name!r}: not defined in the configuration"] * len(items)
        try:
            return target.publish([item.event for item in items])
        except Exception as exc:  # a target must not take the relay down
            return [f"target {name!r} raised {type(exc).__name__}: {exc}"] * len(items)

    def _conclude_round(
        self, items: list[LoggedEvent], queues: dict[str, deque[LoggedEvent]], summary: Summary
    ) -> None:
        blocked: dict[str, int] = {}
        now = utcnow()
        for item in items:  # in seq order within each key
            key = item.event.ordering_key
            if key in blocked:
                self._hold_rest([item], blocked[key], summary)
                continue
            routed = self.routes.targets_for(item.event.event_type)
            failures = {
                name: d["error"]
                for name, d in item.deliveries.items()
                if name in routed and d.get("state") == DeliveryState.FAILED
            }
            if failures:
                item.settle(EventStatus.FAILED, json.dumps(failures, ensure_ascii=False))
                summary.failed += 1
                summary.errors = ([*summary.errors, f"seq {item.event.seq}: {failures}"])[-20:]
                blocked[key] = item.event.seq
                if key in queues:
                    self._hold_rest(queues.pop(key), item.event.seq, summary)
            else:
                item.published_at = now
                item.settle(EventStatus.PUBLISHED)
                summary.published += 1
                if len(summary.latencies_ms) < _LATENCY_SAMPLES * 4:
                    delay = (now - as_utc(item.event.logged_at)).total_seconds() * 1000
                    summary.latencies_ms.append(round(delay, 3))

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline
