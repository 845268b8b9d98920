"""The intermediaries as the console's page shows them: what each one's own metrics
listener says (``metrics: {port}`` in its section; a tier's member ``i`` at ``port + i``),
read when the page is viewed.

An intermediary is a process of its own; its totals (subscribers, subscriptions, frames
sent and dropped, subscribers dropped as too slow, refusals, each upstream connected or
served stale) are the ``tidings_intermediary_*`` families of its ``/metrics``, parsed with
prometheus-client's own parser; its parts (each subscriber, the upstream boxes, a tier
member's responsibility) are its JSON ``/status``
(:mod:`tidings.intermediary.serving.status`), the boxes drawn by :mod:`.drawing`. One
without an endpoint, or not answering, is shown as such; the others are still read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tidings.config import TidingsConfig
from tidings.config.intermediary import IntermediaryConfig
from tidings.config.metrics import MetricsListenConfig
from tidings.console.drawing import Drawing, draw

#: How long one intermediary's endpoint is given to answer.
TIMEOUT_S = 1.0
_PREFIX = "tidings_intermediary_"


@dataclass
class IntermediaryView:
    """One intermediary: its figures by name (labels joined into the name), or why not."""

    name: str
    listen: str
    metrics_url: str | None
    figures: dict[str, float] = field(default_factory=dict)
    stale: list[str] = field(default_factory=list)
    problem: str = ""
    #: Its ``/status`` (None: not read), and the drawing of its boxes.
    status: dict[str, Any] | None = None
    drawing: Drawing | None = None


def intermediaries_of(config: TidingsConfig) -> dict[str, IntermediaryConfig]:
    """The file's intermediaries by the name their part has in ``tidings run``."""
    found = {f"intermediary.{name}": section for name, section in config.intermediaries.items()}
    if "intermediary" in config.model_fields_set:
        found = {"intermediary": config.intermediary, **found}
    return found


def _endpoints(config: TidingsConfig) -> list[tuple[str, str, MetricsListenConfig, int]]:
    """Each intermediary and tier member: its name, address, metrics section and offset."""
    found = [
        (name, section.listen, section.metrics, 0)
        for name, section in intermediaries_of(config).items()
    ]
    for name, tier in config.intermediary_tiers.items():
        found.extend(
            (f"tier.{name} member {i}", member, tier.metrics, i)
            for i, member in enumerate(tier.members)
        )
    return found


def read_intermediaries(config: TidingsConfig) -> list[IntermediaryView]:
    """Each intermediary's figures and status, read now from its metrics listener
    (blocking)."""
    views = []
    for name, listen, metrics, offset in _endpoints(config):
        url = None if metrics.port is None else _url(metrics.address, metrics.port + offset)
        view = IntermediaryView(name, listen, url)
        if url is None:
            view.problem = "no metrics endpoint (set metrics: {port: ...} in its section)"
        else:
            _read(view, url)
        views.append(view)
    return views


def _read(view: IntermediaryView, url: str) -> None:
    try:
        reply = httpx.get(url, timeout=TIMEOUT_S)
        reply.raise_for_status()
    except httpx.HTTPError as exc:
        view.problem = f"its metrics endpoint did not answer: {type(exc).__name__}"
        return
    for family in text_string_to_metric_families(reply.text):
        if not family.name.startswith(_PREFIX):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            short = sample.name.removeprefix(_PREFIX).removesuffix("_total")
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            key = f"{short}{{{labels}}}" if labels else short
            view.figures[key] = sample.value
            if short == "upstream_stale" and sample.value:
                view.stale.append(sample.labels.get("upstream", "?"))
    _read_status(view, url.removesuffix("/metrics") + "/status")


def _read_status(view: IntermediaryView, url: str) -> None:
    try:
        reply = httpx.get(url, timeout=TIMEOUT_S)
        reply.raise_for_status()
        status = reply.json()
    except (httpx.HTTPError, ValueError) as exc:
        view.problem = f"its /status did not answer: {type(exc).__name__}"
        return
    if not isinstance(status, dict) or not isinstance(status.get("subscribers"), list):
        view.problem = "its /status is not an intermediary's status (an older tidings?)"
        return
    view.status = status
    view.drawing = draw(status)


def _url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    host = "127.0.0.1" if address in ("0.0.0.0", "") else host
    return f"http://{host}:{port}/metrics"
