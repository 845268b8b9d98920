"""Prometheus metrics of a running event server, at ``http://<address>:<port>/metrics`` when
its configuration has a ``metrics:`` section.

The Eventer server keeps plain counters (requests, queries, notifications:
:mod:`tidings.server.eventer.counters`) and this module counts the stored events by
listening to the engine, as the Eventer's notifications do; the rest is read at scrape time
from the running parts (connected clients, Syncer peers), as
:mod:`tidings.streams.consumers.metrics` reads its stream. Each server has a registry of its
own, so several servers in one process (tests, a pair in sync) do not share or clash over
metric names; the endpoint is prometheus_client's HTTP server thread, stopped with the
server.

Per-peer lag in events is not exported: the Syncer protocol tells a client only that it has
caught up (``MsgSynced``), not how far behind it is; ``tidings_server_syncer_peer_synced``
is 1 when it has.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tidings.accept import TOO_MANY_FROM_ADDRESS
from tidings.errors import ConfigError
from tidings.events.model import StoredEvent
from tidings.server.async_engine import AsyncEngine
from tidings.server.eventer.counters import EventerCounters
from tidings.server.eventer.server import EventerServer
from tidings.server.log_retention import LogRetention
from tidings.server.syncer.client import SyncerClient
from tidings.server.syncer.server import SyncerServer


class RunningParts(Protocol):
    """What the metrics read of a running server (the runner's ``RunningServer``), at
    each scrape: the parts come and go (the Eventer server with the Monitor's blessing, the
    Syncer clients with the peers)."""

    @property
    def engine(self) -> AsyncEngine: ...

    @property
    def counters(self) -> EventerCounters: ...

    @property
    def eventer(self) -> EventerServer | None: ...

    @property
    def syncer(self) -> SyncerServer | None: ...

    @property
    def peers(self) -> list[SyncerClient]: ...

    @property
    def retention(self) -> LogRetention | None: ...


class _StoredCounter:
    """Counts the events the engine stores, by whether this server registered them or a
    Syncer brought them from a peer (their id names another server)."""

    def __init__(self, server_id: int) -> None:
        self.server_id = server_id
        self.local = 0
        self.synced = 0

    def __call__(self, events: list[StoredEvent]) -> None:
        synced = sum(1 for e in events if e.id.server != self.server_id)
        self.synced += synced
        self.local += len(events) - synced


class _ServerCollector(Collector):
    def __init__(self, running: RunningParts, stored: _StoredCounter) -> None:
        self._running = running
        self._stored = stored

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        running = self._running
        registered = CounterMetricFamily(
            "tidings_server_events_registered",
            "Events stored, by source: local (Eventer clients, modules, the server's own) "
            "or syncer (from a peer server)",
            labels=["source"],
        )
        registered.add_metric(["local"], self._stored.local)
        registered.add_metric(["syncer"], self._stored.synced)
        yield registered
        counters = running.counters
        for name, value, doc in (
            ("register_requests", counters.register_requests, "Eventer register requests"),
            ("queries", counters.queries, "Eventer queries answered"),
            ("notifications", counters.notifications, "Eventer notify messages sent"),
        ):
            yield CounterMetricFamily(f"tidings_server_{name}", doc, value=value)
        refused = CounterMetricFamily(
            "tidings_server_tls_handshakes_refused",
            "TLS handshakes refused (an untrusted or missing client certificate, plaintext "
            "sent to a TLS port, no handshake in time), by listener",
            labels=["listener"],
        )
        refused.add_metric(["eventer"], counters.refused_handshakes)
        refused.add_metric(
            ["syncer"], 0 if running.syncer is None else running.syncer.refused_handshakes
        )
        yield refused
        closed = CounterMetricFamily(
            "tidings_server_connections_refused",
            "Connections closed at accept, before any byte was read, by listener and reason "
            "(too_many_from_address: the client address held max_connections_per_address)",
            labels=["listener", "reason"],
        )
        closed.add_metric(["eventer", TOO_MANY_FROM_ADDRESS], counters.refused_connections)
        closed.add_metric(
            ["syncer", TOO_MANY_FROM_ADDRESS],
            0 if running.syncer is None else running.syncer.refused_connections,
        )
        yield closed
        access = CounterMetricFamily(
            "tidings_server_eventer_refusals",
            "Eventer refusals by identity or grant: clients (an unknown certificate identity, "
            "an anonymous client where none are served), logins, registered events, queries "
            "and subscriptions (narrowed to what is granted)",
            labels=["refused"],
        )
        for label, value in (
            ("client", counters.refused_clients),
            ("login", counters.refused_logins),
            ("event", counters.refused_events),
            ("query", counters.refused_queries),
            ("subscription", counters.refused_subscriptions),
        ):
            access.add_metric([label], value)
        yield access
        yield GaugeMetricFamily(
            "tidings_server_eventer_clients",
            "Eventer clients connected",
            value=0 if running.eventer is None else running.eventer.client_count,
        )
        peers = GaugeMetricFamily(
            "tidings_server_syncer_peer_connected",
            "Syncer client connected to the peer (1) or not (0)",
            labels=["peer"],
        )
        synced = GaugeMetricFamily(
            "tidings_server_syncer_peer_synced",
            "The peer has sent every event it had (1), or not yet (0)",
            labels=["peer"],
        )
        for client in running.peers:
            peers.add_metric([str(client.peer_server_id)], int(client.connected))
            synced.add_metric([str(client.peer_server_id)], int(client.synced))
        yield peers
        yield synced
        if running.syncer is not None:
            clients = GaugeMetricFamily(
                "tidings_server_syncer_clients",
                "Peer servers connected to this server's Syncer, by whether they caught up",
                labels=["synced"],
            )
            states = [s for _, s in running.syncer.clients]
            clients.add_metric(["true"], sum(states))
            clients.add_metric(["false"], len(states) - sum(states))
            yield clients
        if running.retention is not None:
            deleted = CounterMetricFamily(
                "tidings_server_retention_deleted",
                "Events the log's retention deleted, by rule (its index and patterns)",
                labels=["rule"],
            )
            for index in range(len(running.retention.config.rules)):
                name = running.retention.rule_name(index)
                deleted.add_metric([name], running.retention.deleted[name])
            yield deleted


class MetricsEndpoint:
    """The ``/metrics`` endpoint of one running server."""

    def __init__(self, running: RunningParts, address: str, port: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._stored = _StoredCounter(running.engine.server_id)
        self._unsubscribe = running.engine.subscribe(self._stored)
        self.registry.register(_ServerCollector(running, self._stored))
        try:
            self._http, self._thread = start_http_server(port, addr=address, registry=self.registry)
        except OSError as exc:
            self._unsubscribe()
            raise ConfigError(
                f"metrics: cannot serve on {address}:{port}: {exc.strerror or exc}"
            ) from None
        self.port = self._http.server_port

    def close(self) -> None:
        """Stop serving (the HTTP thread ends) and stop counting."""
        self._unsubscribe()
        self._http.shutdown()
        self._http.server_close()
        if isinstance(self._thread, threading.Thread):
            self._thread.join(5)
