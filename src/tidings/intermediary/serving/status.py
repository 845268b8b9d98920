"""What a running intermediary is doing, for an operator: the JSON ``/status`` its metrics
listener serves beside ``/metrics`` (the console's Intermediaries page reads it).

Prometheus figures are totals; an operator looking at one intermediary needs its parts: each
subscriber (identity, address, subscriptions, rate, priority, how long since it was served,
frames dropped, bytes queued), the boxes it asks upstream for, each upstream's staleness and,
for a member of a tier, the slots and areas it is responsible for. Nothing secret is in it:
identities are names, never a password or a token.

It is built on the event loop (:meth:`StatusEndpoint.status` hands the call over from the
HTTP thread), so it reads one consistent moment of structures only the loop writes. The
reply is bounded: at most :data:`MAX_SUBSCRIBERS` subscribers and :data:`MAX_BOXES` boxes,
and it says how many more there are.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tidings.errors import UsageError
from tidings.intermediary.regions.geometry import Box, Relative, Subscription

if TYPE_CHECKING:
    from tidings.intermediary.serving.connection import Connection
    from tidings.intermediary.serving.transport import IntermediaryServer

#: The most subscribers one reply lists (oldest connections first).
MAX_SUBSCRIBERS = 100
#: The most boxes one list of boxes holds.
MAX_BOXES = 200
#: How long the HTTP thread waits for the event loop to build a reply.
TIMEOUT_S = 2.0

#: A tier member's responsibility: a JSON-ready mapping, made on the event loop.
Responsibility = Callable[[], Mapping[str, Any]]


def box_json(box: Box) -> dict[str, list[float]]:
    """A box as the reply spells it."""
    return {"lo": [float(v) for v in box.lo], "hi": [float(v) for v in box.hi]}


def boxes_json(boxes: Iterable[Box]) -> dict[str, Any]:
    """At most :data:`MAX_BOXES` boxes, and how many more there were."""
    every = list(boxes)
    return {
        "boxes": [box_json(b) for b in every[:MAX_BOXES]],
        "more": max(0, len(every) - MAX_BOXES),
    }


def _region(subscription: Subscription) -> dict[str, Any]:
    if isinstance(subscription, Relative):
        return {
            "shape": type(subscription.region).__name__.lower(),
            "relative_to": str(subscription.entity_id),
            "bounds": box_json(subscription.region.bounds()),
        }
    return {"shape": type(subscription).__name__.lower(), "bounds": box_json(subscription.bounds())}


def _subscriber(server: IntermediaryServer, conn: Connection, now: float) -> dict[str, Any]:
    client = conn.websocket.client
    records = server.intermediary.publishers.subscriptions(conn.id)
    subscriptions: list[dict[str, Any]] = [
        {"kind": "region", "key": key, "priority": record.priority, **_region(record.subscription)}
        for key, record in sorted(records.items())
    ]
    if server.views is not None:
        subscriptions.extend(server.views.described(conn.id))
    rates = [float(r) for one in subscriptions if (r := one.get("rate_hz")) is not None]
    dropped = conn.replaced + sum(int(one.get("dropped_frames", 0)) for one in subscriptions)
    last_served: float | None = None
    try:
        info = server.intermediary.scheduler.info(conn.id)
    except UsageError:  # no region subscription: not scheduled there
        pass
    else:
        rates.append(info.rate_hz)
        dropped += info.dropped_total
        last_served = info.last_served
    return {
        "id": conn.id,
        "identity": conn.grant.identity,
        "address": None if client is None else f"{client.host}:{client.port}",
        "subscriptions": subscriptions,
        "rate_hz": max(rates, default=None),
        "priority": max(
            (float(one["priority"]) for one in subscriptions if "priority" in one), default=None
        ),
        "last_served_s_ago": None if last_served is None else round(now - last_served, 3),
        "dropped_frames": dropped,
        "queued_bytes": conn.queued_bytes,
    }


def status_of(
    server: IntermediaryServer, responsibility: Responsibility | None = None
) -> dict[str, Any]:
    """The status of ``server`` now (call it on its event loop)."""
    now = server.clock()
    connections = list(server.connections.values())
    store = server.intermediary.subscriptions
    upstreams = {} if server.upstreams is None else dict(server.upstreams())
    return {
        "subscribers": [_subscriber(server, conn, now) for conn in connections[:MAX_SUBSCRIBERS]],
        "more_subscribers": max(0, len(connections) - MAX_SUBSCRIBERS),
        "upstreams": {
            name: {"stale": health.why is not None, "why": health.why}
            for name, health in upstreams.items()
        },
        "world": None if store.world is None else box_json(store.world),
        "coverage": boxes_json(store.boxes),
        "responsibility": None if responsibility is None else dict(responsibility()),
    }


class StatusEndpoint:
    """``/status`` of one server, answered from the metrics listener's thread."""

    def __init__(
        self,
        server: IntermediaryServer,
        loop: asyncio.AbstractEventLoop,
        responsibility: Responsibility | None = None,
    ) -> None:
        self._server = server
        self._loop = loop
        self._responsibility = responsibility

    async def _build(self) -> bytes:
        return json.dumps(status_of(self._server, self._responsibility)).encode()

    def status(self) -> bytes:
        """The reply's body, built on the loop (blocking this thread up to :data:`TIMEOUT_S`;
        TimeoutError when the loop does not get to it)."""
        future = asyncio.run_coroutine_threadsafe(self._build(), self._loop)
        try:
            return future.result(TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            raise
