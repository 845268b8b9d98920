"""Where a part serves its Prometheus metrics: the ``metrics: {port, address}`` shape shared
by the relay (:class:`tidings.config.relay.MetricsConfig`, which adds its own label bound)
and ``tidings intermediary serve``, so an operator writes the same two keys everywhere.

Kept in a module of its own so a part's section reuses it without importing another part's.
"""

from __future__ import annotations

from pydantic import Field

from tidings.config.model import StrictModel


class MetricsListenConfig(StrictModel):
    """Prometheus metrics at ``http://<address>:<port>/metrics``; ``port`` None means no HTTP
    endpoint is started."""

    port: int | None = Field(
        default=None,
        gt=0,
        lt=65536,
        description="The port of the /metrics endpoint (None: no endpoint).",
    )
    address: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="The interface /metrics listens on; 0.0.0.0 exposes it on every interface.",
    )
