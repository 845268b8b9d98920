"""Prometheus metrics of a running intermediary, at ``http://<address>:<port>/metrics`` when
its configuration's ``metrics:`` has a port (issue 30).

As the event server's (:mod:`tidings.server.metrics`), everything is read at scrape time
from the running server: the totals it keeps (:class:`.counters.ServingCounters`, the
Gatekeeper's refusals, the schedulers' dropped frames) and what it holds now (connections,
subscriptions, each upstream's state). The HTTP server is prometheus_client's, on a thread
of its own with a registry of its own, so several intermediaries in one process do not clash
and a scrape never waits for the event loop: it reads plain integers and sizes, which the
loop writes.

Every refusal reason (:data:`.counters.REFUSALS`) is exported from the start, at 0 until it
happens, so an alert on ``increase(tidings_intermediary_refusals_total[5m])`` needs no
series to appear first; ``bench/hostile`` reads every ``tidings_*refus*`` line.

The same listener answers ``/status`` (:mod:`.status`): the JSON an operator's console
reads for per-subscriber figures, the coverage boxes and a tier member's responsibility.
It has the metrics' bind and their (absent) access control: loopback by default.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tidings.errors import ConfigError
from tidings.intermediary.serving.counters import REFUSALS
from tidings.intermediary.serving.status import Responsibility, StatusEndpoint

if TYPE_CHECKING:
    from tidings.intermediary.serving.transport import IntermediaryServer

_Family = CounterMetricFamily | GaugeMetricFamily


class _IntermediaryCollector(Collector):
    def __init__(self, server: IntermediaryServer) -> None:
        self._server = server

    def collect(self) -> Iterator[_Family]:
        server = self._server
        counters = server.counters
        access = server.access
        yield GaugeMetricFamily(
            "tidings_intermediary_subscribers",
            "Subscribers connected (past the handshake)",
            value=len(server.connections),
        )
        subscriptions = GaugeMetricFamily(
            "tidings_intermediary_subscriptions",
            "Subscriptions held, by kind: event (a stream of event types), view (a SQL view), "
            "region (a spatial region)",
            labels=["kind"],
        )
        events, views = (0, 0) if server.views is None else server.views.counts()
        subscriptions.add_metric(["event"], events)
        subscriptions.add_metric(["view"], views)
        subscriptions.add_metric(["region"], len(server.intermediary.publishers))
        yield subscriptions
        refusals = CounterMetricFamily(
            "tidings_intermediary_refusals",
            "Handshakes, connections and requests refused, by reason (docs/operations/"
            "metrics.md lists them)",
            labels=["reason"],
        )
        for reason in REFUSALS:
            count = counters.refusals.get(reason, 0) + access.refusals.get(reason, 0)
            refusals.add_metric([reason], count)
        yield refusals
        blocks = 0 if access.throttle is None else access.throttle.blocks
        yield CounterMetricFamily(
            "tidings_intermediary_login_blocks",
            "Times a client address was blocked for failing to log in too often",
            value=blocks,
        )
        yield CounterMetricFamily(
            "tidings_intermediary_frames_sent",
            "Binary frames (region views) sent to subscribers",
            value=counters.frames_sent,
        )
        yield CounterMetricFamily(
            "tidings_intermediary_messages_sent",
            "JSON messages (events, SQL views, notices) sent to subscribers",
            value=counters.messages_sent,
        )
        dropped = CounterMetricFamily(
            "tidings_intermediary_frames_dropped",
            "Frames and view messages a slow subscriber did not get, by cause: not_ready (its "
            "channel was busy when it was due), replaced (a newer one took its place unsent)",
            labels=["cause"],
        )
        not_ready = server.intermediary.scheduler.dropped_total
        if server.views is not None:
            not_ready += server.views.scheduler.dropped_total
        dropped.add_metric(["not_ready"], not_ready)
        dropped.add_metric(["replaced"], counters.replaced)
        yield dropped
        yield CounterMetricFamily(
            "tidings_intermediary_subscribers_dropped",
            "Subscribers disconnected for being too slow (close code 4008)",
            value=counters.subscribers_dropped,
        )
        yield from _upstreams(server)


def _upstreams(server: IntermediaryServer) -> Iterator[_Family]:
    if server.upstreams is None:
        return
    connected = GaugeMetricFamily(
        "tidings_intermediary_upstream_connected",
        "The upstream is connected and caught up (1), or lost or catching up (0)",
        labels=["upstream"],
    )
    stale = GaugeMetricFamily(
        "tidings_intermediary_upstream_stale",
        "Subscribers are served the upstream's last state, marked stale (1), or not (0)",
        labels=["upstream"],
    )
    for name, staleness in server.upstreams().items():
        connected.add_metric([name], int(staleness.why is None))
        stale.add_metric([name], int(staleness.why is not None))
    yield connected
    yield stale


class IntermediaryMetrics:
    """The ``/metrics`` and ``/status`` endpoints of one running intermediary server (made
    on its event loop); :meth:`close` it. ``responsibility`` is a tier member's."""

    def __init__(
        self,
        server: IntermediaryServer,
        address: str,
        port: int,
        responsibility: Responsibility | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_IntermediaryCollector(server))
        status = StatusEndpoint(server, asyncio.get_running_loop(), responsibility)
        try:
            self._http, self._thread = start_http_server(port, addr=address, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"metrics: cannot serve on {address}:{port}: {exc.strerror or exc}"
            ) from None
        self._http.set_app(_with_status(self._http.get_app(), status))
        self.port: int = self._http.server_port

    def close(self) -> None:
        """Stop serving (the HTTP thread ends)."""
        self._http.shutdown()
        self._http.server_close()
        if isinstance(self._thread, threading.Thread):
            self._thread.join(5)


def _with_status(metrics: WSGIApplication | None, status: StatusEndpoint) -> WSGIApplication:
    """The metrics' WSGI app, with ``/status`` answered by ``status``."""
    assert metrics is not None  # start_http_server set it

    def app(environ: WSGIEnvironment, start: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/status":
            return metrics(environ, start)
        try:
            body, code = status.status(), "200 OK"
        except TimeoutError:
            body, code = (
                b'{"error": "the intermediary is too busy to answer"}',
                "503 Service Unavailable",
            )
        start(code, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app
