"""Sending one round of a publishing run to its targets: calls, retries and narrowing.

The publisher (:mod:`tidings.pipeline.publishing.publisher`) decides what may go in a round: per
(partition key, target) lane, one event, or a run of them for an atomic target or one that
chains a key's events itself (``events_per_key``). This module
sends each target's units, the targets in parallel, and finds out whom to blame:

* a call that fails as a whole (:class:`~tidings.errors.TargetCallFailed`, any exception)
  is narrowed: split until the failing event is alone, so the others are published and not
  charged a retry;
* an event that failed on its own gets its failure recorded at that target with the error
  and, while tries are left, when the next one is due
  (:mod:`tidings.pipeline.publishing.retry`); the publisher sends the retry when it is due,
  each retry charged, without holding the others;
* a target that is unavailable (:class:`~tidings.errors.TargetUnavailable`) charges nothing:
  its circuit breaker opens and its units wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tidings.errors import TargetCallFailed, TargetUnavailable
from tidings.events.timeutil import utcnow
from tidings.pipeline.publishing.breaker import CircuitBreaker, breaker_for
from tidings.pipeline.publishing.outcome import CONFIRMED, FAILED, LoggedEvent, Summary
from tidings.pipeline.publishing.retry import RetryPolicy
from tidings.redaction import scrub
from tidings.targets.base import Target

TargetLookup = Callable[[str], Target | None]
BreakerLookup = Callable[[Target], CircuitBreaker]


@dataclass(eq=False)
class Unit:
    """What one (key, target) lane sends in one round: one event, or a run (atomic targets,
    and targets that chain a key's events).

    ``culprit`` is the event that failed on its own (the unit's later events wait behind it);
    ``waiting`` is set when the target was unavailable and nothing was charged.
    """

    key: str
    items: list[LoggedEvent]
    culprit: LoggedEvent | None = None
    error: str | None = None
    waiting: str | None = None


class Delivery:
    """Sends units to targets, looked up (with their breakers) once per name."""

    def __init__(
        self,
        targets: TargetLookup,
        retry: RetryPolicy,
        *,
        breakers: BreakerLookup = breaker_for,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._lookup = targets
        self._targets: dict[str, Target | None] = {}
        self.retry = retry
        self._breakers = breakers
        self._breaker_of: dict[str, CircuitBreaker] = {}
        self.clock = clock
        self._lock = threading.Lock()
        self._summary = Summary()

    def target(self, name: str) -> Target | None:
        """The target called ``name``, looked up once."""
        if name not in self._targets:
            self._targets[name] = self._lookup(name)
        return self._targets[name]

    def breaker(self, name: str) -> CircuitBreaker:
        """The circuit breaker of the (defined) target called ``name``."""
        breaker = self._breaker_of.get(name)
        if breaker is None:
            target = self.target(name)
            assert target is not None, "only defined targets have a breaker"
            breaker = self._breaker_of[name] = self._breakers(target)
        return breaker

    def deliver(self, units: dict[str, list[Unit]], summary: Summary) -> None:
        """Send every target's units (targets in parallel); retries are counted in ``summary``."""
        self._summary = summary
        if len(units) == 1:
            self._deliver_to(*next(iter(units.items())))
            return
        with ThreadPoolExecutor(max_workers=len(units)) as pool:
            list(pool.map(lambda kv: self._deliver_to(*kv), units.items()))

    def _deliver_to(self, name: str, units: list[Unit]) -> None:
        """One try; each failing event's failure is recorded with when to try it again.

        Sending again an event that failed before counts as a retry.
        """
        again = {id(u.items[0]) for u in units if u.items[0].failed_at(name)}
        failing = self._try(name, units)
        for unit in units:
            if unit.waiting is None and id(unit.items[0]) in again:
                self._charge(unit.items[0])
        now = self.clock()
        stamp = utcnow().isoformat()
        for unit in failing:
            culprit = unit.culprit
            assert culprit is not None
            with self._lock:
                failures = culprit.deliveries.get(name, {}).get("failures", 0) + 1
                error = None if unit.error is None else scrub(unit.error)
                state = {"state": FAILED, "error": error, "at": stamp, "failures": failures}
                if failures < self.retry.attempts:
                    state["retry_at"] = round(now + self.retry.delay(failures), 3)
                culprit.deliveries[name] = state
                culprit.changed = True

    def _charge(self, item: LoggedEvent) -> None:
        with self._lock:
            item.retry_count += 1
            item.changed = True
            self._summary.retries += 1

    def _try(self, name: str, units: list[Unit]) -> list[Unit]:
        """One call with ``units``; the units whose culprit failed on its own are returned.

        A call that fails as a whole is narrowed: split in halves, each tried alone, until a
        failing unit is alone; an atomic run alone is split the same way (its halves in log
        order, the second only after the first was confirmed).
        """
        target = self.target(name)
        items = [item for unit in units for item in unit.items]
        if target is None:
            error = f"unknown target {name!r}: not defined in the configuration"
            return self._blame(units, error)
        breaker = self.breaker(name)
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
        went = [i for i, r in zip(items, results, strict=True) if r is None]
        self._confirm(name, went)
        if items and len(went) == len(items):  # the usual case: all went
            breaker.succeeded()
            return []
        errors = dict(zip(map(id, items), results, strict=True))
        failing: list[Unit] = []
        for unit in units:
            culprit = next((i for i in unit.items if errors[id(i)] is not None), None)
            if culprit is not None:
                unit.culprit, unit.error = culprit, errors[id(culprit)]
                failing.append(unit)
        if len(failing) < len(units) or any(result is None for result in results):
            breaker.succeeded()  # a run that failed after confirmed events reached it too
        elif failing:
            breaker.failed(failing[0].error or "", {u.key for u in failing})
        return failing

    def _narrow(self, name: str, units: list[Unit], error: str) -> list[Unit]:
        """Split a call that failed as a whole; each part is tried alone (see :meth:`_try`).

        The parts are new units of what is still unconfirmed; their outcome is copied back
        to the units of the call at the end.
        """
        parts = [(Unit(u.key, [i for i in u.items if not i.confirmed_at(name)]), u) for u in units]
        parts = [(part, unit) for part, unit in parts if part.items]
        if len(parts) == 1 and len(parts[0][0].items) == 1:  # found: the event failed alone
            self.breaker(name).failed(error, {parts[0][0].key})
            self._blame([parts[0][0]], error)
        elif len(parts) == 1:  # one run: its first half, then the rest if that went
            part = parts[0][0]
            half = len(part.items) // 2
            for piece in (part.items[:half], part.items[half:]):
                sub = Unit(part.key, piece)
                self._try(name, [sub])
                part.culprit, part.error, part.waiting = sub.culprit, sub.error, sub.waiting
                if sub.culprit is not None or sub.waiting is not None:
                    break
        else:
            half = len(parts) // 2
            self._try(name, [part for part, _ in parts[:half]])
            if any(part.waiting is not None for part, _ in parts[:half]):
                for part, _ in parts[half:]:  # the target went down: the rest waits
                    part.waiting = self.breaker(name).reason()
            else:
                self._try(name, [part for part, _ in parts[half:]])
        for part, unit in parts:
            unit.culprit, unit.error, unit.waiting = part.culprit, part.error, part.waiting
        return [unit for part, unit in parts if part.culprit is not None]

    def _blame(self, units: list[Unit], error: str) -> list[Unit]:
        for unit in units:
            unit.culprit, unit.error = unit.items[0], error
        return units

    def _confirm(self, name: str, items: list[LoggedEvent]) -> None:
        # One state for the call's events: states are replaced, never changed in place, and
        # the outcome's groups then encode it once (see outcome._outcome_groups).
        state = {"state": CONFIRMED, "at": utcnow().isoformat()}
        with self._lock:
            for item in items:
                item.deliveries[name] = state
                item.changed = True


def _describe(name: str, exc: BaseException) -> str:
    return f"target {name!r} raised {type(exc).__name__}: {exc}"
