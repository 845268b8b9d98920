"""What a subscriber of intermediaries does, whatever it is connected to: one intermediary
(:class:`.client.IntermediaryClient`) or a cluster of them, following redirects and
handovers (:class:`.handover.ClusterClient`). Both are a :class:`Subscriber`, and code that
only subscribes regions and reads their frames depends on that protocol, not on either.

A frame arrives as a :class:`ReceivedFrame`: the subscription's key and the frame decoded
(:func:`~tidings.intermediary.node.generation.decode_frame`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, Self

import numpy as np

from tidings.intermediary.node.generation import FrameHeader


@dataclass(frozen=True)
class ReceivedFrame:
    """A decoded frame of subscription ``key``."""

    key: str
    header: FrameHeader
    ids: np.ndarray
    positions: np.ndarray

    def world_positions(self) -> np.ndarray:
        """Positions in world coordinates (relative ones shifted by the frame's origin)."""
        positions: np.ndarray = self.positions.astype(np.float64)
        if self.header.origin is not None:
            positions = positions + np.asarray(self.header.origin)
        return positions


def subscribe_request(
    key: str,
    region: dict[str, Any],
    *,
    priority: float,
    rate_hz: float,
    capabilities: dict[str, Any] | None,
) -> dict[str, Any]:
    """The subscribe request of a region subscription, as the server reads it."""
    request: dict[str, Any] = {
        "op": "subscribe",
        "key": key,
        "region": region,
        "priority": priority,
        "rate_hz": rate_hz,
    }
    if capabilities is not None:
        request["capabilities"] = capabilities
    return request


class Subscriber(Protocol):
    """A connected subscriber: subscribe regions by key, read their frames, unsubscribe,
    close (``async with`` closes it). A refusal raises
    :class:`~tidings.errors.IntermediaryError` with the server's message."""

    #: Frames lost because the caller read too slowly (the buffer keeps the latest).
    overflowed: int

    async def subscribe(
        self,
        key: str,
        region: dict[str, Any],
        *,
        priority: float = 0.0,
        rate_hz: float = 10.0,
        capabilities: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Subscribe (or replace) ``key`` to ``region`` (the wire form of
        :func:`~tidings.intermediary.regions.geometry.parse_region`); the server's reply."""
        request = subscribe_request(
            key, region, priority=priority, rate_hz=rate_hz, capabilities=capabilities
        )
        return await self._subscribe_region(key, request)

    async def _subscribe_region(self, key: str, request: dict[str, Any]) -> dict[str, Any]:
        """Send the subscribe ``request`` of ``key`` where it belongs; the server's reply."""
        ...

    async def unsubscribe(self, key: str) -> dict[str, Any]:
        """Unsubscribe ``key``; the server's reply."""
        ...

    def frames(self) -> AsyncIterator[ReceivedFrame]:
        """The frames as they arrive, until the connection closes."""
        ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
