"""Prometheus metrics of the relay, fed from the batch log by the driver's own loop.

Spark runs the publishing in worker processes, so the driver learns what happened from the
summaries each batch appends to ``tidings_batch_log``. The relay's driver loop
(:func:`tidings.pipeline.relay.run_relay`) calls :meth:`BatchLogFollower.poll` between its
waits; the follower reads the new summaries and updates the counters, and every few seconds
refreshes the gauges from :func:`tidings.pipeline.status.health_report` (indexed reads only).

It is not a Spark ``StreamingQueryListener``: Spark calls a Python listener back through the
Py4J gateway from its listener bus thread, and the calls that arrive while the session
shuts down fail with ``Py4JException`` stack traces on stderr. Polling from the driver's
loop has no callback to fail.

Label cardinality is bounded: ``target`` values are the configured targets; ``event_type``
keeps the first ``metrics.max_event_types`` types the process sees, and every later one is
counted as ``other``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from sqlalchemy import Engine, func, select

from tidings.errors import ConfigError
from tidings.events.outbox import OPEN_STATUSES
from tidings.outbox.schema import batch_log, ensure_schema
from tidings.pipeline.publishing.outcome import Summary
from tidings.pipeline.status import HealthReport, health_report
from tidings.routing.table import Routes

#: The label value of event types past the cap.
OTHER = "other"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class LabelCap:
    """Keeps the first ``limit`` distinct values; every later one becomes :data:`OTHER`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return OTHER


class RelayMetrics:
    """The relay's metrics, in a registry of their own (one per relay; tests make several)."""

    def __init__(self, max_event_types: int = 100, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.event_type = LabelCap(max_event_types)
        r = self.registry
        self.published = Counter(
            "tidings_events_published_total",
            "Events confirmed by every routed target",
            registry=r,
        )
        self.failed = Counter(
            "tidings_events_failed_total", "Events marked FAILED after their retries", registry=r
        )
        self.retries = Counter("tidings_publish_retries_total", "Publish retries", registry=r)
        self.held = Counter(
            "tidings_events_held_total",
            "Events held behind an earlier event of their key",
            registry=r,
        )
        self.unroutable = Counter(
            "tidings_events_unroutable_total",
            "Events with no route for their type",
            ["event_type"],
            registry=r,
        )
        self.target_published = Counter(
            "tidings_target_events_published_total",
            "Events that became PUBLISHED, counted at each target they were routed to",
            ["target", "event_type"],
            registry=r,
        )
        self.target_failed = Counter(
            "tidings_target_events_failed_total",
            "Events that became FAILED at a target",
            ["target", "event_type"],
            registry=r,
        )
        self.latency = Histogram(
            "tidings_publish_latency_seconds",
            "From commit (logged_at) to confirmation by every target",
            ["event_type"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.open_events = Gauge(
            "tidings_open_events", "Events the relay still works on", ["status"], registry=r
        )
        self.set_aside = Gauge(
            "tidings_set_aside_events",
            "Events that wait for an operator (PARKED, UNROUTABLE)",
            ["status"],
            registry=r,
        )
        self.oldest_open = Gauge(
            "tidings_oldest_open_age_seconds",
            "Age (now - logged_at) of the oldest event in each open status",
            ["status"],
            registry=r,
        )
        self.target_open = Gauge(
            "tidings_target_open_events",
            "Events a target has not confirmed, by why (pending, held, failed, parked)",
            ["target", "state"],
            registry=r,
        )
        self.keys_behind_failed = Gauge(
            "tidings_keys_held_behind_failed",
            "Partition keys whose later events wait behind a FAILED event",
            registry=r,
        )
        self.lag_events = Gauge(
            "tidings_relay_lag_events",
            "Sequence numbers committed but not yet taken by the relay",
            registry=r,
        )
        self.lag_seconds = Gauge(
            "tidings_relay_lag_seconds",
            "Age of the oldest event the relay has not yet taken (0: none)",
            registry=r,
        )
        self.batch_age = Gauge(
            "tidings_relay_last_batch_age_seconds",
            "Seconds since the relay's newest logged batch finished (-1: none yet)",
            registry=r,
        )

    def count(self, summary: Summary) -> None:
        """Add one batch summary to the counters."""
        self.published.inc(summary.published)
        self.failed.inc(summary.failed)
        self.retries.inc(summary.retries)
        self.held.inc(summary.held)
        for etype, n in summary.unroutable_types.items():
            self.unroutable.labels(self.event_type(etype)).inc(n)
        if summary.unroutable and not summary.unroutable_types:  # a summary of an older relay
            self.unroutable.labels(OTHER).inc(summary.unroutable)
        for counter, counts in (
            (self.target_published, summary.published_to),
            (self.target_failed, summary.failed_at),
        ):
            for target, by_type in counts.items():
                for etype, n in by_type.items():
                    counter.labels(target, self.event_type(etype)).inc(n)
        types = summary.latency_types
        for i, ms in enumerate(summary.latencies_ms):
            etype = types[i] if i < len(types) else OTHER
            self.latency.labels(self.event_type(etype)).observe(ms / 1000)

    def show(self, report: HealthReport) -> None:
        """Set the gauges from a health report."""
        for status in OPEN_STATUSES:
            self.open_events.labels(status.value).set(report.counts.get(status.value, 0))
            self.oldest_open.labels(status.value).set(
                report.oldest_age_seconds.get(status.value, 0)
            )
        for aside in ("PARKED", "UNROUTABLE"):
            self.set_aside.labels(aside).set(report.counts.get(aside, 0))
        self.target_open.clear()  # a target with nothing open any more drops its series
        for target, figures in report.targets.items():
            for state, n in vars(figures).items():
                self.target_open.labels(target, state).set(n)
        self.keys_behind_failed.set(report.keys_held_behind_failed)
        self.lag_events.set(report.lag_events)
        self.lag_seconds.set(report.lag_seconds)
        age = report.last_batch_age_seconds
        self.batch_age.set(-1 if age is None else age)


class BatchLogFollower:
    """Reads every batch summary appended since the last call, for the metrics and for the
    relay's own account of a run (:attr:`total`, :attr:`health`)."""

    def __init__(
        self,
        engine: Engine,
        metrics: RelayMetrics | None = None,
        routes: Callable[[], Routes] | None = None,
        *,
        refresh_every: float = 5.0,
        job: str | None = None,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.routes = routes
        self.refresh_every = refresh_every
        self.job = job
        self.total = Summary()
        self.health: HealthReport | None = None
        self._refreshed = float("-inf")
        ensure_schema(engine)
        with engine.connect() as conn:
            self.last_id = conn.execute(select(func.max(batch_log.c.id))).scalar() or 0

    def poll(self, *, refresh: bool = False) -> list[Summary]:
        """Take the new summaries; refresh the health figures if ``refresh`` or if
        ``refresh_every`` seconds have passed."""
        query = select(batch_log.c.id, batch_log.c.summary).where(batch_log.c.id > self.last_id)
        if self.job is not None:
            query = query.where(batch_log.c.job == self.job)
        summaries = []
        with self.engine.connect() as conn:
            for row_id, text in conn.execute(query.order_by(batch_log.c.id)):
                self.last_id = row_id
                summary = Summary(**json.loads(text))
                summaries.append(summary)
                self.total.merge(summary)
                if self.metrics is not None:
                    self.metrics.count(summary)
        if refresh or time.monotonic() - self._refreshed >= self.refresh_every:
            self._refreshed = time.monotonic()
            self.health = health_report(
                self.engine, self.routes() if self.routes else None, errors=0
            )
            if self.metrics is not None:
                self.metrics.show(self.health)
        return summaries


def serve_metrics(registry: CollectorRegistry, port: int, address: str = "127.0.0.1") -> None:
    """Expose ``registry`` at ``http://address:port/metrics``; a port or address that cannot
    be bound is a :class:`~tidings.errors.ConfigError` naming it."""
    try:
        start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}"
        ) from None
