"""Prometheus metrics of the streams with ``metrics: true``, served by the event server's
own metrics endpoint (its ``metrics:`` section: on 127.0.0.1 unless ``metrics.address``
says otherwise).

Not on the stream's own port: a stream listens where its consumers reach it, often beyond
this host, and its metrics name every user and consumer component; one endpoint per server
process, bound to loopback by default, keeps them on this host unless the operator says so.

Read at scrape time from the store (:func:`.admin.stream_status`), so they show what
``tidings streams status`` shows: each registered consumer's position and lag, and the
newest and oldest retained ids; plus the push sessions open right now. Each consumer is
labelled ``stream``, ``user`` and ``component``. The refusals are counted since the server
started, by ``user`` (empty for a failed authentication) and ``reason``
(:mod:`tidings.streams.service.refusals`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tidings.config.streams import StreamConfig
from tidings.server.store import EventStore
from tidings.streams.consumers.admin import stream_status


@dataclass(frozen=True)
class MeasuredStream:
    """A stream whose metrics are exported, and how to read its live counts at a scrape."""

    config: StreamConfig
    #: Reliable push sessions open now.
    push_sessions: Callable[[], int]
    #: Refusals so far by (user, reason): a copy, taken whole (the loop goes on counting).
    refusals: Callable[[], Mapping[tuple[str, str], int]]


class StreamsCollector(Collector):
    """The metrics of ``streams``, read when the endpoint is scraped (in its thread: the
    store's reads block). One collector for all of a server's streams, since a metric name
    may appear only once per endpoint."""

    def __init__(self, store: EventStore, streams: Sequence[MeasuredStream]) -> None:
        self._store = store
        self._streams = list(streams)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["stream", "user", "component"]
        ids = GaugeMetricFamily(
            "tidings_stream_id", "Newest and oldest retained event id", labels=["stream", "end"]
        )
        position = GaugeMetricFamily(
            "tidings_stream_consumer_position", "Acknowledged event id", labels=labels
        )
        lag = GaugeMetricFamily(
            "tidings_stream_consumer_lag_events",
            "Stream events not yet acknowledged",
            labels=labels,
        )
        sessions = GaugeMetricFamily(
            "tidings_stream_push_sessions", "Reliable push sessions open", labels=["stream"]
        )
        refused = CounterMetricFamily(
            "tidings_stream_refusals",
            "Requests refused: failed authentications and missing permissions",
            labels=["stream", "user", "reason"],
        )
        for stream in self._streams:
            status = stream_status(self._store, stream.config)
            name = stream.config.name
            if status.last_id is not None:
                ids.add_metric([name, "last"], status.last_id)
            if status.first_id is not None:
                ids.add_metric([name, "first"], status.first_id)
            for consumer in status.consumers:
                key = [name, consumer.user, consumer.component]
                position.add_metric(key, consumer.position)
                lag.add_metric(key, consumer.behind)
            sessions.add_metric([name], stream.push_sessions())
            for (user, reason), count in sorted(stream.refusals().items()):
                refused.add_metric([name, user, reason], count)
        yield from (ids, position, lag, sessions, refused)
