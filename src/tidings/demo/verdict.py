"""The demo's end-to-end verdict, judged against what the bank committed.

Truth comes from the bank's own database: the outbox rows (what was committed, in sequence
order; rolled-back transactions left none) and the ``account`` table. Against it:

- each reliable consumer got every committed event its stream carries, and nothing else;
  duplicates are counted (delivery is at least once) and forgiven by event id; per account,
  the first deliveries come in the order the events were logged;
- the event server's store holds each relayed event once, and the module's alerts match the
  large withdrawals one for one;
- every SQL-view subscriber's last view equals the ``account`` table;
- every outbox row is PUBLISHED.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import Engine, select

from tidings.demo.alerts import ALERT, DEFAULT_THRESHOLD
from tidings.demo.deployment import STREAM_TYPES
from tidings.demo.watchers import ACCOUNTS_VIEW, ConsumerLog, Delivery, SubscriberLog
from tidings.events.outbox import EventStatus
from tidings.outbox.schema import outbox_event
from tidings.server.store import EventStore


@dataclass(frozen=True)
class Committed:
    """One committed outbox event the stream carries."""

    event_id: str
    key: str | None
    event_type: str
    amount: int | None


@dataclass
class ConsumerVerdict:
    component: str
    received: int
    missing: int
    extra: int
    duplicates: int
    out_of_order: int
    latencies_ms: list[float]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.out_of_order)


@dataclass
class Verdict:
    committed: int
    rolled_back: int
    consumers: list[ConsumerVerdict]
    live_received: int
    stored_once: bool
    store_duplicates: int
    alerts_expected: int
    alerts_stored: int
    alerts_seen_by_subscriber: int
    views_equal: bool
    view_rows: int
    not_published: int
    subscriber_latencies_ms: list[float]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def committed_events(engine: Engine) -> list[Committed]:
    """The committed events the stream carries, in the order they were logged."""
    carried = set(STREAM_TYPES.values())
    rows = []
    with engine.connect() as conn:
        for event_id, etype, key, payload in conn.execute(
            select(
                outbox_event.c.event_id,
                outbox_event.c.event_type,
                outbox_event.c.partition_key,
                outbox_event.c.payload,
            ).order_by(outbox_event.c.seq)
        ):
            if etype in carried:
                data = json.loads(payload).get("data", {})
                amount = data.get("amount") if etype == "MoneyWithdrawn" else None
                rows.append(Committed(event_id, key, etype, amount))
    return rows


def account_rows(engine: Engine) -> list[list[object]]:
    """The bank's account table, as the SQL view's subscribers should see it."""
    with engine.connect() as conn:
        return [list(row) for row in conn.exec_driver_sql(ACCOUNTS_VIEW)]


def judge_consumer(log: ConsumerLog, committed: list[Committed]) -> ConsumerVerdict:
    """Missing, extra, duplicated and out-of-order deliveries of one reliable consumer."""
    expected = {c.event_id for c in committed}
    counts = Counter(d.event_id for d in log.deliveries)
    first: dict[str, Delivery] = {}
    for delivery in log.deliveries:
        first.setdefault(delivery.event_id, delivery)
    arrival = {event_id: n for n, event_id in enumerate(first)}
    last: dict[str | None, int] = {}
    disorder = 0
    for event in committed:
        place = arrival.get(event.event_id)
        if place is None:
            continue
        if event.key in last and place < last[event.key]:
            disorder += 1
        last[event.key] = place
    return ConsumerVerdict(
        log.component,
        len(log.deliveries),
        len(expected - counts.keys()),
        len(counts.keys() - expected),
        sum(n - 1 for n in counts.values()),
        disorder,
        [first[e].latency_ms for e in first if e in expected],
    )


def judge(
    engine: Engine,
    store_url: str,
    consumers: list[ConsumerLog],
    live: ConsumerLog,
    subscribers: SubscriberLog,
    rolled_back: int,
    failures: list[str],
) -> Verdict:
    """The verdict on the whole chain (see the module docstring)."""
    committed = committed_events(engine)
    verdicts = [judge_consumer(log, committed) for log in consumers]
    store = EventStore(store_url)
    try:
        stored = store.read(0, limit=10_000_000)
    finally:
        store.close()
    relayed = Counter(e.outbox_event_id for e in stored if e.outbox_event_id is not None)
    alerts = [json.loads(e.payload or b"{}") for e in stored if e.type == ALERT]
    large = {c.event_id for c in committed if (c.amount or 0) >= DEFAULT_THRESHOLD}
    accounts = account_rows(engine)
    with engine.connect() as conn:
        not_published = conn.execute(
            select(outbox_event.c.event_id).where(
                outbox_event.c.status != EventStatus.PUBLISHED.value
            )
        ).all()
    views = subscribers.views
    verdict = Verdict(
        committed=len(committed),
        rolled_back=rolled_back,
        consumers=verdicts,
        live_received=len(live.deliveries),
        stored_once=all(relayed[c.event_id] == 1 for c in committed),
        store_duplicates=sum(n - 1 for n in relayed.values()),
        alerts_expected=len(large),
        alerts_stored=len(alerts),
        alerts_seen_by_subscriber=subscribers.alerts,
        views_equal=bool(views) and all(rows == accounts for rows in views.values()),
        view_rows=len(accounts),
        not_published=len(not_published),
        subscriber_latencies_ms=[d.latency_ms for d in subscribers.events],
    )
    verdict.problems = failures + _problems(verdict, large, {a.get("of") for a in alerts})
    return verdict


def _problems(verdict: Verdict, large: set[str], alerted: set[object]) -> list[str]:
    problems = [
        f"consumer {c.component}: {c.missing} missing, {c.extra} not committed, "
        f"{c.out_of_order} out of key order"
        for c in verdict.consumers
        if not c.ok
    ]
    if not verdict.stored_once or verdict.store_duplicates:
        problems.append(f"event store: {verdict.store_duplicates} duplicates or missing events")
    if verdict.alerts_stored != len(large) or alerted != large:
        problems.append(
            f"module: {verdict.alerts_stored} alerts stored for {len(large)} large withdrawals"
        )
    if not verdict.views_equal:
        problems.append("intermediary: a SQL view differs from the account table")
    if verdict.not_published:
        problems.append(f"outbox: {verdict.not_published} events not PUBLISHED")
    return problems


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (NaN when there are none)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]
