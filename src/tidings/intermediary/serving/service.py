"""An intermediary run as a service against an event server (``tidings intermediary serve``).

:func:`serve_intermediary` wires the library's parts from the validated ``intermediary:`` section of
the configuration (:class:`tidings.config.IntermediaryConfig`): a
:class:`~.event_server_upstream.TidingsChain` to the event server, :class:`~.eventviews.EventViews`
over it with the configured tables as the SQL catalog, and an
:class:`~.transport.IntermediaryServer` serving them until ``stop`` is set: WebSocket at ``/``, and
at ``/live`` a page that subscribes like any subscriber and shows events as a list and views as
tables. Its query string lists the subscriptions, each repeatable:
``?events=app/orders/*,app/users/*`` (Hat patterns, segments joined by ``/``), ``?sql=SELECT ...``
(``&rate_hz=``, ``&priority=``); it does not validate them but shows the server's error
(``static/live.js``).

Who may subscribe to what, and TLS, come from the section too: its ``tls:`` serves the
socket and the pages over TLS only (``wss://``, ``https://``), its ``subscribers:`` and
``anonymous:`` make the :class:`~.access.Gatekeeper` every handshake goes through; a
certificate that cannot be used, or a subscriber's hash variable that is not set, ends the
start with a :class:`~tidings.errors.ConfigError` naming it. Its ``limits:`` bound the
connections per client address and throttle the addresses that fail to log in
(:mod:`.addresses`); its ``metrics:``, with a port, serves Prometheus metrics
(:mod:`.metrics`; a port that cannot be listened on is a ConfigError too).

Spatial state does not come from an event server: with the ``spatial:`` section the service
also subscribes to a publisher of moving entities over the spatial feed
(:mod:`.feed.wire`; ``tidings intermediary simulate`` runs one) and serves ``region``
subscriptions (and the moving map at ``/view``) from it; without it a ``region``
subscription is answered with an error naming that, and the others go on.

An event server (none of the group's addresses answering) or spatial publisher unreachable at
start is an :class:`~tidings.errors.IntermediaryError` (the command's exit 2). A connection
lost while serving is ridden out: the service keeps serving the last state, tells every
subscriber the upstream is stale (:func:`.envelope.status_message`), reconnects with backoff
and resynchronises (:class:`~.event_server_upstream.TidingsChain`,
:class:`~.feed.resilient.ResilientFeed`), then tells them it is fresh; no subscriber re-subscribes.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tidings.config import IntermediaryConfig
from tidings.errors import IntermediaryError
from tidings.intermediary.feed.remote import NO_TLS, margin_intermediary
from tidings.intermediary.feed.resilient import ResilientFeed
from tidings.intermediary.node.intermediary import Intermediary
from tidings.intermediary.regions.geometry import Box
from tidings.intermediary.serving.access import Gatekeeper
from tidings.intermediary.serving.addresses import LoginThrottle
from tidings.intermediary.serving.metrics import IntermediaryMetrics
from tidings.intermediary.serving.page import static_page_routes
from tidings.intermediary.serving.transport import IntermediaryServer, TransportLimits
from tidings.intermediary.staleness import Staleness
from tidings.intermediary.views.event_server_upstream import TidingsChain
from tidings.intermediary.views.eventviews import EventViews
from tidings.intermediary.views.sqlviews import Catalog, SqlLimits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Listening:
    """Where a started service serves: its WebSocket endpoint and its page (``/live``)."""

    websocket: str
    page: str
    event_server: str
    #: The spatial publisher's URL, if the service has one.
    spatial: str | None = None
    #: The Prometheus endpoint's URL, if it serves one.
    metrics: str | None = None


class _NoSpatialUpstream:
    """The spatial part's upstream: never asked, because region subscriptions are refused
    before they reach it (:class:`EventServerIntermediary`)."""

    def subscribe(self, boxes: Sequence[Box]) -> None:
        raise IntermediaryError("region: this intermediary has no spatial upstream")

    def unsubscribe(self, boxes: Sequence[Box]) -> None:
        pass

    def follow(self, entities: frozenset[int]) -> None:
        if entities:
            raise IntermediaryError("region: this intermediary has no spatial upstream")


async def spatial_intermediary(
    urls: Sequence[str], world: Box, margin: float, tls: Mapping[str, Any] = NO_TLS
) -> tuple[Intermediary, ResilientFeed]:
    """An intermediary fed by the spatial publisher at ``urls`` through a
    :class:`ResilientFeed` (see :func:`.feed.remote.remote_intermediary` for its policy;
    ``tls``: the TLS options of a ``wss://`` publisher)."""
    node: Intermediary | None = None

    def held() -> np.ndarray:
        return np.empty(0, np.int64) if node is None else np.asarray(node.state.snapshot().ids)

    feed = await ResilientFeed.connect(urls, world.dim, held, tls=tls)
    node = margin_intermediary(feed, world, margin)
    return node, feed


class EventServerIntermediary(IntermediaryServer):
    """An intermediary server whose upstream is an event server (events and SQL views) and,
    if ``spatial`` is given, a spatial publisher (``region`` subscriptions)."""

    def __init__(
        self,
        event_server: str,
        views: EventViews,
        *,
        tick_s: float,
        limits: TransportLimits,
        spatial: tuple[Intermediary, ResilientFeed] | None = None,
        upstreams: Callable[[], Mapping[str, Staleness]] | None = None,
        access: Gatekeeper | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        node, source = (
            (Intermediary(2, _NoSpatialUpstream()), None)
            if spatial is None
            else (spatial[0], spatial[1].take)
        )
        super().__init__(
            node,
            source=source,
            views=views,
            tick_s=tick_s,
            limits=limits,
            upstreams=upstreams,
            access=access,
            tls=tls,
        )
        self.event_server = event_server
        self.spatial = spatial is not None
        self.app.router.routes.extend(static_page_routes("live"))

    async def handle_request(
        self, subscriber: int, request: dict[str, object]
    ) -> dict[str, object]:
        if request.get("op") == "subscribe" and "region" in request and not self.spatial:
            raise IntermediaryError(
                f"region: this intermediary's upstream is the event server {self.event_server}, "
                "which has no spatial state; subscribe to events or sql"
            )
        return await super().handle_request(subscriber, request)


def catalog_of(config: IntermediaryConfig) -> Catalog | None:
    """The SQL catalog of the configured tables (None: no tables, no SQL views)."""
    if not config.tables:
        return None
    return Catalog.from_mapping(
        {name: dict(table.columns) for name, table in config.tables.items()},
        keys={name: table.keyed_by for name, table in config.tables.items()},
    )


async def serve_intermediary(
    config: IntermediaryConfig,
    stop: asyncio.Event,
    on_listening: Callable[[Listening], None] | None = None,
) -> None:
    """Serve until ``stop`` is set; an :class:`IntermediaryError` if no event server of the
    configuration can be reached at start or the address cannot be listened on."""
    host, _, port = config.listen.rpartition(":")
    host = host.strip("[]")
    limits = config.limits
    catalog = catalog_of(config)
    throttle = None
    if limits.max_failed_logins is not None:
        throttle = LoginThrottle(
            limits.max_failed_logins,
            limits.failed_login_window.total_seconds(),
            limits.failed_login_block.total_seconds(),
        )
    access = Gatekeeper.from_config(config, throttle=throttle)  # a hash variable not set: here
    tls = None if config.tls is None else config.tls.context()
    spatial_tls = {} if config.spatial is None else config.spatial.connect_options()
    chain = TidingsChain(
        config.event_servers,
        request_timeout=config.request_timeout.total_seconds(),
        tls=config.event_server_tls,
    )
    await chain.start()
    spatial: tuple[Intermediary, ResilientFeed] | None = None
    try:
        if config.spatial is not None:
            world = Box(tuple(config.spatial.world_lo), tuple(config.spatial.world_hi))
            spatial = await spatial_intermediary(
                [config.spatial.upstream], world, config.spatial.margin, spatial_tls
            )
        views = EventViews(
            chain,
            catalog,
            row_type_prefix=config.row_type_prefix,
            limits=SqlLimits(
                max_rows=limits.max_view_rows, timeout_s=limits.view_timeout.total_seconds()
            ),
            max_per_subscriber=limits.max_subscriptions_per_subscriber,
            workers=limits.view_workers,
        )
        server = EventServerIntermediary(
            ", ".join(config.event_servers),
            views,
            tick_s=config.tick.total_seconds(),
            limits=TransportLimits(
                max_message_bytes=limits.max_request_bytes,
                requests_per_s=limits.requests_per_s,
                burst=limits.request_burst,
                max_connections=limits.max_connections,
                max_connections_per_address=limits.max_connections_per_address,
                tls_handshake_timeout_s=limits.tls_handshake_timeout.total_seconds(),
                max_queued_messages=limits.max_queued_messages,
                max_queued_bytes=limits.max_queued_bytes,
            ),
            spatial=spatial,
            upstreams=lambda: {
                "event_server": chain.staleness,
                **({} if spatial is None else {"spatial": spatial[1].staleness}),
            },
            access=access,
            tls=tls,
        )
        await server.start(host, int(port))
        metrics: IntermediaryMetrics | None = None
        try:
            if config.metrics.port is not None:
                metrics = IntermediaryMetrics(server, config.metrics.address, config.metrics.port)
            shown = f"[{host}]" if ":" in host else host
            secure = "s" if tls is not None else ""
            where = Listening(
                f"ws{secure}://{shown}:{server.port}/",
                f"http{secure}://{shown}:{server.port}/live",
                chain.address,
                None if spatial is None else spatial[1].url,
                None if metrics is None else _metrics_url(config.metrics.address, metrics.port),
            )
            log.info(
                "intermediary listening",
                extra={"websocket": where.websocket, "page": where.page,
                       "event_server": where.event_server, "tables": sorted(config.tables),
                       "metrics": where.metrics},
            )  # fmt: skip
            if on_listening is not None:
                on_listening(where)
            await stop.wait()
        finally:
            if metrics is not None:
                metrics.close()
            await server.aclose()
    finally:
        if spatial is not None:
            await spatial[1].aclose()
        await chain.aclose()
    log.info("intermediary stopped", extra={"event_server": chain.address})


def _metrics_url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/metrics"
