"""Which subscriber's view to generate next: per-subscriber rates and a priority queue with
aging (Figs. 7a-c, [138], [141]-[146], claims 5-10).

Each subscriber is scheduled once, whatever number of subscriptions it has (its view is
generated from all of them at once): with a base priority (a number from the request, or a
callable computed from the state, e.g. by distance, [145]), a rate in Hz and whether its
channel is ready to write. What makes a subscriber *due* are the patent's triggers: its
timer (the rate: never more often than it asked), its channel becoming ready again, and,
with ``per_epoch=True``, new state (a subscriber is not served twice from one epoch).

**Rate and jitter.** The rate is kept as a generic cell rate algorithm (the leaky bucket of
ATM and of most HTTP rate limiters): every serve has an ideal time, one period after the
previous serve's ideal time or, when the serve came later than that, its actual time; the
next serve may come ``jitter`` of a period before its ideal time. With ``jitter = 0`` that is
a strict minimum interval of one period. With ``jitter = j > 0`` two serves are at least
``(1 - j)`` periods apart and a window of ``T`` seconds holds at most
``1 + (T + j * period) / period`` serves, so the long-run rate is still at most the asked one;
what it buys: when new state arrives at the asked rate but with jitter (ticks a few
milliseconds early or late, a serve one round late), a serve that came late does not push
the next one past the next epoch, which would skip it (a 10 Hz subscriber of a 10 Hz
publisher got about 77 % of its frames with a strict interval). The default is 0 without
``per_epoch`` and :data:`EPOCH_JITTER` with it.

Among due subscribers the highest priority goes first, and every serve raises the priority
of each one still waiting by ``aging`` (step 782) — so a low priority is delayed but never
starves. Incrementing every waiting entry would cost O(n) per serve; instead an entry that
became due when ``s0`` serves had been made has, after ``S`` serves, the priority
``base + aging * (S - s0)``; ``S`` is common to all, so ordering by the constant key
``base - aging * s0`` orders by aged priority exactly, and a heap keeps every operation
O(log n) (lazy deletion, compacted when stale entries outnumber live ones). Ties go to the
entry that became due first.

**Bound on waiting.** Let ``n`` be the number of subscribers scheduled at some time during
the wait (those added meanwhile count), ``P`` the largest base priority allowed
(``max_priority``), ``a`` the aging increment and ``p`` the base priority of a subscriber
``x`` that became due at serve count ``s0`` and stays ready. Another entry ``y`` (base
``p_y`` <= ``P``, due since ``s_y``) is served before ``x`` only if its aged priority is
higher at that moment, i.e. ``s_y < s0 + (p_y - p) / a <= s0 + W`` with
``W = (P - p) / a``. Entries due before ``x`` are at most one per other subscriber
(``n - 1``); every further entry of a subscriber that is *served* before ``x`` follows an
earlier serve of that subscriber inside the window ``(s0, s0 + W)`` (an entry ended by a
dropped frame is not a serve), and there are at most ``ceil(W)`` serves in that window.
So at most ``n - 1 + ceil((P - p) / a)`` other serves happen before ``x`` is served
(:meth:`Scheduler.max_wait_serves`); with ``budget`` serves per generation round that is at
most ``ceil((n + ceil((P - p) / a)) / budget)`` rounds. A subscriber with the top priority
waits at most ``n - 1`` serves, as in plain round-robin.

**Slow subscribers.** When a subscriber is due but its channel is not ready, its frame is
dropped (counted, and it is rescheduled one period later); a send never waits on it, so it
never holds the others ([146]). After ``max_dropped`` consecutive drops (or whatever the
``on_drop`` policy hook decides) it is reported for disconnection with a reason
(:meth:`Scheduler.take_disconnects`) and no longer scheduled. When its channel becomes ready
again it is due at once if its rate allows.

Times (``now``) are seconds on a monotonic clock, passed in by the caller, so the scheduler is
deterministic and testable; they may not go backwards.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Literal

from tidings.errors import UsageError

#: A base priority: a number, or a callable evaluated each time the subscriber becomes due.
Priority = float | Callable[[], float]
#: The drop policy: (subscriber, consecutive drops, total drops) -> a reason, or None to keep.
DropPolicy = Callable[[Hashable, int, int], str | None]

_Where = Literal["timer", "due", "parked", "reported"]

#: Bounds on what the scheduler accepts (absurd values are refused, not clamped).
MAX_RATE_HZ = 10_000.0
#: The default ``jitter`` of a scheduler paced by new state (``per_epoch=True``): half a
#: period, so a serve may follow an epoch that arrived up to half a period early.
EPOCH_JITTER = 0.5
#: A timer this close after ``now`` has expired: ideal times are sums of periods, and their
#: rounding (0.01 added a hundred times is not 1.0) made a subscriber that asked for exactly
#: the rate of its server's rounds miss one now and then (found by the property test).
_CLOCK_TOLERANCE_S = 1e-9
DEFAULT_MAX_PRIORITY = 1_000.0


@dataclass(frozen=True)
class SubscriberStatus:
    """What the scheduler knows of one subscriber (a copy, for metrics and tests)."""

    subscriber_id: Hashable
    rate_hz: float
    ready: bool
    #: ``"timer"`` (waiting for its rate), ``"due"``, ``"parked"`` (waiting for new state),
    #: ``"reported"`` (reported for disconnection).
    where: str
    served: int
    last_served: float | None
    dropped_total: int
    dropped_consecutive: int
    #: The serve count at which it became due (None unless ``where == "due"``).
    due_since: int | None


class _Sub:
    __slots__ = (
        "base",
        "dropped_run",
        "dropped_total",
        "due_since",
        "ideal",
        "last_served",
        "period",
        "priority",
        "rate_hz",
        "ready",
        "served",
        "served_epoch",
        "sid",
        "version",
        "where",
    )

    def __init__(self, sid: Hashable, priority: Priority, rate_hz: float, ready: bool) -> None:
        self.sid = sid
        self.priority = priority
        self.rate_hz = rate_hz
        self.period = 1.0 / rate_hz
        self.ready = ready
        self.version = 0
        self.where: _Where = "timer"
        self.base = 0.0
        self.due_since: int | None = None
        self.last_served: float | None = None
        #: The ideal time of the last serve (see the module doc's "Rate and jitter").
        self.ideal: float | None = None
        self.served = 0
        self.served_epoch = -1
        self.dropped_total = 0
        self.dropped_run = 0


class Scheduler:
    """Decides which subscribers a generation round serves, in O(log n) per operation.

    Use ``due(now, budget)`` for a round (it picks and records the serves), or
    ``next_due(now)`` to peek at the next one and ``served(id, now)`` once it is served.
    """

    def __init__(
        self,
        aging: float = 1.0,
        *,
        max_priority: float = DEFAULT_MAX_PRIORITY,
        max_dropped: int = 50,
        on_drop: DropPolicy | None = None,
        per_epoch: bool = False,
        jitter: float | None = None,
    ) -> None:
        self.aging = _positive(aging, "aging", math.inf)
        self.max_priority = _positive(max_priority, "max_priority", 1e12)
        if isinstance(max_dropped, bool) or not isinstance(max_dropped, int) or max_dropped < 1:
            raise UsageError(f"max_dropped must be an int >= 1, not {max_dropped!r}")
        if on_drop is not None and not callable(on_drop):
            raise UsageError(f"on_drop must be callable, not {on_drop!r}")
        self.max_dropped = max_dropped
        self.on_drop = on_drop
        self.per_epoch = per_epoch
        if jitter is None:
            jitter = EPOCH_JITTER if per_epoch else 0.0
        if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter < 1:
            raise UsageError(f"jitter must be a number in [0, 1), not {jitter!r}")
        #: The share of a period a serve may come before its ideal time (module doc).
        self.jitter = float(jitter)
        self._subs: dict[Hashable, _Sub] = {}
        #: (next_at, seq, version, id): waiting for the rate to allow a serve.
        self._timer: list[tuple[float, int, int, Hashable]] = []
        #: (-(base - aging * due_since), seq, version, id): due, best first.
        self._due: list[tuple[float, int, int, Hashable]] = []
        self._parked: list[_Sub] = []
        self._reports: list[tuple[Hashable, str]] = []
        self._seq = 0
        self._serves = 0
        #: Frames dropped since the start, every subscriber's (for metrics: a subscriber's
        #: own count goes with it).
        self.dropped_total = 0
        self._epoch = 0
        self._now = -math.inf

    # -- subscribers -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._subs)

    def __contains__(self, subscriber_id: object) -> bool:
        return subscriber_id in self._subs

    @property
    def serves(self) -> int:
        """Serves made so far (the clock that priorities age by)."""
        return self._serves

    def add(
        self, subscriber_id: Hashable, priority: Priority, rate_hz: float, *, ready: bool = True
    ) -> None:
        """Schedule a subscriber; it is due at once (its first view)."""
        try:
            hash(subscriber_id)
        except TypeError:
            raise UsageError(f"subscriber id must be hashable, not {subscriber_id!r}") from None
        if subscriber_id in self._subs:
            raise UsageError(f"subscriber {subscriber_id!r} is already scheduled")
        if not callable(priority):
            self._check_priority(priority, subscriber_id)
        rate = _positive(rate_hz, f"rate_hz of subscriber {subscriber_id!r}", MAX_RATE_HZ)
        sub = _Sub(subscriber_id, priority, rate, bool(ready))
        self._subs[subscriber_id] = sub
        self._push_timer(sub, -math.inf)

    def remove(self, subscriber_id: Hashable) -> None:
        """Stop scheduling a subscriber (safe wherever it is queued)."""
        sub = self._get(subscriber_id)
        del self._subs[subscriber_id]
        if sub.where == "parked":
            self._parked.remove(sub)
        sub.version += 1
        self._maybe_compact()

    def set_rate(self, subscriber_id: Hashable, rate_hz: float) -> None:
        """Change a subscriber's rate; the next serve keeps the new minimum interval."""
        sub = self._get(subscriber_id)
        sub.rate_hz = _positive(rate_hz, f"rate_hz of subscriber {subscriber_id!r}", MAX_RATE_HZ)
        sub.period = 1.0 / sub.rate_hz
        if sub.where == "timer":
            self._push_timer(sub, self._earliest(sub))

    def set_priority(self, subscriber_id: Hashable, priority: Priority) -> None:
        """Change the base priority; it applies from the next time the subscriber is due."""
        sub = self._get(subscriber_id)
        if not callable(priority):
            self._check_priority(priority, subscriber_id)
        sub.priority = priority

    def set_ready(self, subscriber_id: Hashable, ready: bool) -> None:
        """Record whether the subscriber's channel can take a write now (the "channel ready"
        trigger: one that missed frames is due again as soon as its rate allows)."""
        sub = self._get(subscriber_id)
        was = sub.ready
        sub.ready = bool(ready)
        if sub.ready and not was and sub.where == "timer" and sub.dropped_run:
            self._push_timer(sub, self._earliest(sub))

    def state_updated(self, epoch: int) -> None:
        """The state store reached ``epoch``: subscribers parked for new state are due."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < self._epoch:
            raise UsageError(f"epoch must be an int >= {self._epoch}, not {epoch!r}")
        self._epoch = epoch
        parked, self._parked = self._parked, []
        for sub in parked:
            self._push_due(sub)

    def info(self, subscriber_id: Hashable) -> SubscriberStatus:
        """A copy of what the scheduler knows of one subscriber."""
        sub = self._get(subscriber_id)
        return SubscriberStatus(
            subscriber_id=sub.sid,
            rate_hz=sub.rate_hz,
            ready=sub.ready,
            where=sub.where,
            served=sub.served,
            last_served=sub.last_served,
            dropped_total=sub.dropped_total,
            dropped_consecutive=sub.dropped_run,
            due_since=sub.due_since if sub.where == "due" else None,
        )

    def max_wait_serves(self, priority: float) -> int:
        """The most serves of others before a ready, due subscriber of base ``priority`` is
        served: ``n - 1 + ceil((max_priority - priority) / aging)``, ``n`` being the
        subscribers scheduled now (see the module doc: add any added and removed during a
        wait)."""
        self._check_priority(priority, "(bound)")
        return max(len(self._subs) - 1, 0) + math.ceil((self.max_priority - priority) / self.aging)

    def take_disconnects(self) -> list[tuple[Hashable, str]]:
        """Subscribers reported for disconnection since the last call, with the reason.

        They are no longer scheduled; :meth:`remove` them when their connection is closed."""
        reports, self._reports = self._reports, []
        return reports

    # -- rounds ------------------------------------------------------------------------

    def next_due(self, now: float) -> Hashable | None:
        """The subscriber to serve next at ``now`` (not yet recorded as served), or None."""
        self._advance(now)
        while self._due:
            _, _, version, sid = self._due[0]
            sub = self._subs.get(sid)
            if sub is None or sub.version != version:
                heapq.heappop(self._due)
                continue
            if not sub.ready:
                heapq.heappop(self._due)
                sub.version += 1
                self._drop(sub, now)
                continue
            return sid
        return None

    def served(self, subscriber_id: Hashable, now: float) -> None:
        """Record that the subscriber's view was generated and sent at ``now``."""
        sub = self._get(subscriber_id)
        self._advance(now)
        if sub.where != "due":
            raise UsageError(
                f"subscriber {subscriber_id!r} is not due ({sub.where}): serving it now would "
                f"exceed its rate or serve a reported subscriber"
            )
        if self._due and self._due[0][3] == subscriber_id and self._due[0][2] == sub.version:
            heapq.heappop(self._due)
        self._serves += 1
        sub.served += 1
        sub.last_served = now
        sub.ideal = now if sub.ideal is None else max(sub.ideal + sub.period, now)
        sub.served_epoch = self._epoch
        sub.dropped_run = 0
        self._push_timer(sub, self._earliest(sub))

    def due(self, now: float, budget: int) -> list[Hashable]:
        """Pick and record (as served at ``now``) at most ``budget`` subscribers, best first."""
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise UsageError(f"budget must be an int >= 0, not {budget!r}")
        picked: list[Hashable] = []
        while len(picked) < budget:
            sid = self.next_due(now)
            if sid is None:
                break
            self.served(sid, now)
            picked.append(sid)
        return picked

    # -- internals ---------------------------------------------------------------------

    def _get(self, subscriber_id: Hashable) -> _Sub:
        try:
            return self._subs[subscriber_id]
        except (KeyError, TypeError):
            raise UsageError(f"unknown subscriber {subscriber_id!r}") from None

    def _check_priority(self, priority: object, subscriber_id: Hashable) -> float:
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int | float)
            or not 0 <= priority <= self.max_priority  # also refuses NaN
        ):
            raise UsageError(
                f"priority of subscriber {subscriber_id!r} must be a number in "
                f"0..{self.max_priority}, not {priority!r}"
            )
        return float(priority)

    def _earliest(self, sub: _Sub) -> float:
        if sub.ideal is None:
            return -math.inf
        return sub.ideal + sub.period * (1.0 - self.jitter)

    def _push_timer(self, sub: _Sub, at: float) -> None:
        sub.version += 1
        sub.where = "timer"
        self._seq += 1
        heapq.heappush(self._timer, (at, self._seq, sub.version, sub.sid))
        self._maybe_compact()

    def _push_due(self, sub: _Sub) -> None:
        priority = sub.priority() if callable(sub.priority) else sub.priority
        sub.base = self._check_priority(priority, sub.sid)
        sub.version += 1
        sub.where = "due"
        sub.due_since = self._serves
        self._seq += 1
        key = sub.base - self.aging * self._serves
        heapq.heappush(self._due, (-key, self._seq, sub.version, sub.sid))

    def _advance(self, now: float) -> None:
        """Move subscribers whose timer has expired into the due queue (or drop/park them)."""
        if not isinstance(now, int | float) or isinstance(now, bool) or not math.isfinite(now):
            raise UsageError(f"now must be a finite number of seconds, not {now!r}")
        if now < self._now:
            raise UsageError(f"now went backwards: {now} after {self._now}")
        self._now = now
        while self._timer and self._timer[0][0] <= now + _CLOCK_TOLERANCE_S:
            _, _, version, sid = heapq.heappop(self._timer)
            sub = self._subs.get(sid)
            if sub is None or sub.version != version:
                continue
            if not sub.ready:
                self._drop(sub, now)
            elif self.per_epoch and sub.served_epoch >= self._epoch:
                sub.version += 1
                sub.where = "parked"
                self._parked.append(sub)
            else:
                self._push_due(sub)

    def _drop(self, sub: _Sub, now: float) -> None:
        """The subscriber was due but its channel was not ready: its frame is dropped."""
        sub.dropped_total += 1
        sub.dropped_run += 1
        self.dropped_total += 1
        if self.on_drop is not None:
            reason = self.on_drop(sub.sid, sub.dropped_run, sub.dropped_total)
        elif sub.dropped_run >= self.max_dropped:
            reason = (
                f"channel not ready for {sub.dropped_run} consecutive frames "
                f"(max_dropped={self.max_dropped})"
            )
        else:
            reason = None
        if reason:
            sub.version += 1
            sub.where = "reported"
            self._reports.append((sub.sid, str(reason)))
        else:
            sub.version += 1
            sub.where = "timer"
            self._seq += 1
            heapq.heappush(self._timer, (now + sub.period, self._seq, sub.version, sub.sid))

    def _maybe_compact(self) -> None:
        """Rebuild the heaps when stale entries outnumber live ones (at most one per
        subscriber), so a flood of add/remove/set_ready/set_rate keeps memory bounded."""
        if len(self._timer) + len(self._due) <= 2 * len(self._subs) + 64:
            return

        def live(entry: tuple[float, int, int, Hashable]) -> bool:
            sub = self._subs.get(entry[3])
            return sub is not None and sub.version == entry[2]

        self._timer = [entry for entry in self._timer if live(entry)]
        self._due = [entry for entry in self._due if live(entry)]
        heapq.heapify(self._timer)
        heapq.heapify(self._due)


def _positive(value: object, what: str, top: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= top  # also refuses NaN
        or math.isinf(value)
    ):
        limit = "" if math.isinf(top) else f" and at most {top}"
        raise UsageError(f"{what} must be a finite number > 0{limit}, not {value!r}")
    return float(value)
