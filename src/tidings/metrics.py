"""Prometheus metrics of the relay, fed from the batch log by the driver process.

Spark runs the publishing in worker processes, so the driver learns what happened from the
summaries each batch appends to ``tidings_batch_log``; a streaming-query listener reads the
new ones after every micro-batch and updates these metrics.
"""

from __future__ import annotations

import json

from prometheus_client import Counter, Gauge, Histogram, start_http_server
from pyspark.sql.streaming import StreamingQueryListener
from sqlalchemy import Engine, select

from tidings.outbox.schema import batch_log
from tidings.status import status_report

PUBLISHED = Counter("tidings_events_published_total", "Events confirmed by every routed target")
FAILED = Counter("tidings_events_failed_total", "Events marked FAILED after their retries")
RETRIED = Counter("tidings_publish_retries_total", "Publish retries")
HELD = Counter("tidings_events_held_total", "Events held behind an earlier event of their key")
UNROUTABLE = Counter("tidings_events_unroutable_total", "Events with no route for their type")
LATENCY = Histogram(
    "tidings_publish_latency_seconds",
    "From commit (logged_at) to confirmation by every target",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
OLDEST_OPEN = Gauge(
    "tidings_oldest_pending_age_seconds", "Age of the oldest PENDING, HELD or FAILED event"
)


class BatchLogFollower:
    """Feeds the metrics with every batch summary appended since the last call."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        with engine.connect() as conn:
            self.last_id = (
                conn.execute(select(batch_log.c.id).order_by(batch_log.c.id.desc())).scalar() or 0
            )

    def poll(self) -> list[dict[str, object]]:
        query = select(batch_log.c.id, batch_log.c.summary).where(batch_log.c.id > self.last_id)
        summaries = []
        with self.engine.connect() as conn:
            for row_id, text in conn.execute(query.order_by(batch_log.c.id)):
                self.last_id = row_id
                summary = json.loads(text)
                summaries.append(summary)
                PUBLISHED.inc(summary["published"])
                FAILED.inc(summary["failed"])
                RETRIED.inc(summary["retries"])
                HELD.inc(summary["held"])
                UNROUTABLE.inc(summary["unroutable"])
                for ms in summary["latencies_ms"]:
                    LATENCY.observe(ms / 1000)
        age = status_report(self.engine, per_target=False).oldest_open_age
        OLDEST_OPEN.set(age.total_seconds() if age else 0)
        return summaries


class MetricsListener(StreamingQueryListener):
    """Calls the follower after every micro-batch of the relay query."""

    def __init__(self, follower: BatchLogFollower) -> None:
        self.follower = follower

    def onQueryStarted(self, event: object) -> None:
        pass

    def onQueryProgress(self, event: object) -> None:
        self.follower.poll()

    def onQueryIdle(self, event: object) -> None:
        pass

    def onQueryTerminated(self, event: object) -> None:
        self.follower.poll()


def serve_metrics(port: int) -> None:
    """Expose /metrics on ``port``."""
    start_http_server(port)
