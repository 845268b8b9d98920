"""Prometheus metrics of a stream, at ``<path>/metrics`` on its own endpoint when
``metrics: true``.

Read at scrape time from the store (:func:`.admin.stream_status`), so they
show what ``tidings streams status`` shows: each registered consumer's position and lag,
and the newest and oldest retained ids; plus the push sessions open right now. Each consumer
is labelled ``stream``, ``user`` and ``component``. The refusals are counted since the server
started, by ``user`` (empty for a failed authentication) and ``reason``
(:mod:`tidings.streams.service.refusals`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tidings.config.streams import StreamConfig
from tidings.server.store import EventStore
from tidings.streams.consumers.admin import stream_status

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _StreamCollector(Collector):
    def __init__(
        self,
        store: EventStore,
        stream: StreamConfig,
        push_sessions: int,
        refusals: Mapping[tuple[str, str], int],
    ) -> None:
        self._store = store
        self._stream = stream
        self._push_sessions = push_sessions
        self._refusals = refusals

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        status = stream_status(self._store, self._stream)
        name = self._stream.name
        ids = GaugeMetricFamily(
            "tidings_stream_id", "Newest and oldest retained event id", labels=["stream", "end"]
        )
        if status.last_id is not None:
            ids.add_metric([name, "last"], status.last_id)
        if status.first_id is not None:
            ids.add_metric([name, "first"], status.first_id)
        yield ids
        labels = ["stream", "user", "component"]
        position = GaugeMetricFamily(
            "tidings_stream_consumer_position", "Acknowledged event id", labels=labels
        )
        lag = GaugeMetricFamily(
            "tidings_stream_consumer_lag_events",
            "Stream events not yet acknowledged",
            labels=labels,
        )
        for consumer in status.consumers:
            key = [name, consumer.user, consumer.component]
            position.add_metric(key, consumer.position)
            lag.add_metric(key, consumer.behind)
        yield position
        yield lag
        sessions = GaugeMetricFamily(
            "tidings_stream_push_sessions", "Reliable push sessions open", labels=["stream"]
        )
        sessions.add_metric([name], self._push_sessions)
        yield sessions
        refused = CounterMetricFamily(
            "tidings_stream_refusals",
            "Requests refused: failed authentications and missing permissions",
            labels=["stream", "user", "reason"],
        )
        for (user, reason), count in sorted(self._refusals.items()):
            refused.add_metric([name, user, reason], count)
        yield refused


def stream_metrics(
    store: EventStore,
    stream: StreamConfig,
    push_sessions: int,
    refusals: Mapping[tuple[str, str], int],
) -> bytes:
    """The stream's metrics in Prometheus' text format (blocking: reads the store), with
    ``push_sessions`` reliable push sessions open and the ``refusals`` by (user, reason)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StreamCollector(store, stream, push_sessions, refusals))
    return generate_latest(registry)
