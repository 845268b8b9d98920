"""The ``intermediary_tiers:`` section of ``tidings.yaml``: several intermediaries run as one
tier (the patent's distributed intermediary system) by ``tidings intermediary serve --tier
NAME``: where each member listens, the spatial publisher they share, and how responsibility
is split among them (cells of the world, or buckets of subscriber ids).

Kept apart from :mod:`.intermediary` (one intermediary's section): a tier reuses its spatial
upstream model, and shares with it who may subscribe (:mod:`.intermediary_access`) and TLS
(:mod:`.tls`).
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from tidings.config.intermediary import IntermediarySpatialConfig
from tidings.config.intermediary_access import SubscriberAccess
from tidings.config.metrics import MetricsListenConfig
from tidings.config.model import SECOND, ZERO, Duration, StrictModel, parsed_durations, within
from tidings.config.tls import TlsClientConfig, TlsServerConfig

#: The most members one tier may have (each is a process of the machine).
MAX_MEMBERS = 64
#: The most slots of responsibility (the directory's rows), as the cluster allows.
MAX_SLOTS = 65_536
_UNSPECIFIED = {"0.0.0.0", "::", "[::]", ""}


def _member_address(value: str) -> str:
    """``HOST:PORT`` subscribers can reach: a real port (clients are given the members'
    URLs) and a host that is an address, not "every interface" (a member's URL travels in
    redirects and must name where it is)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(
            f"expected HOST:PORT with a port in 1..65535, e.g. 127.0.0.1:8301, got {value!r}"
        )
    if host in _UNSPECIFIED:
        raise ValueError(
            f"{value!r}: a member's host travels in redirects to subscribers; give the address "
            "they reach it at, not an unspecified one"
        )
    return value


class TierResponsibilityConfig(StrictModel):
    """How the tier's responsibility is cut into slots, shared out among its members."""

    by: Literal["region", "hash"] = Field(
        default="region",
        description=(
            "``region``: the world cut into a grid of cells, a subscription belongs to the cell "
            "holding its region's middle and a member keeps state only for its cells (a view "
            "crossing cells of two members is composed from both); ``hash``: subscribers cut "
            "into buckets by a hash of the id their client declares (every member holds state "
            "anywhere)."
        ),
    )
    cells: list[int] | None = Field(
        default=None,
        description=(
            "With ``by: region``: cells per axis (as many numbers as the world has axes); "
            "default: one cell per member along the first axis."
        ),
    )
    buckets: int = Field(
        default=64,
        ge=1,
        le=MAX_SLOTS,
        description="With ``by: hash``: how many buckets of subscriber ids.",
    )

    @field_validator("cells")
    @classmethod
    def _positive_cells(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(n < 1 for n in v):
            raise ValueError(f"cells: every axis needs at least one cell, got {v}")
        return v


class IntermediaryTierConfig(SubscriberAccess):
    """Several intermediaries as one tier, each its own process, supervised by the process
    ``tidings intermediary serve --tier NAME`` runs."""

    members: list[Annotated[str, AfterValidator(_member_address)]] = Field(
        min_length=1,
        max_length=MAX_MEMBERS,
        description=(
            "``HOST:PORT`` of each member's WebSocket endpoint; subscribers may enter the tier "
            "at any of them (a member redirects a subscription it is not responsible for)."
        ),
    )
    tls: TlsServerConfig | None = Field(
        default=None,
        description=(
            "Every member serves over TLS (``wss://``) with this certificate and key, which "
            "must name every member's host (absent: plaintext)."
        ),
    )
    peer_tls: TlsClientConfig | None = Field(
        default=None,
        description=(
            "With ``tls``: how a member verifies another's certificate when it takes the "
            "pieces of a view in that member's cells (absent: against the system's CAs)."
        ),
    )
    spatial: IntermediarySpatialConfig = Field(
        description="The spatial publisher every member follows, and the world it covers."
    )
    responsibility: TierResponsibilityConfig = Field(
        default=TierResponsibilityConfig(),
        description="How responsibility is split among the members.",
    )
    replace_dead: bool = Field(
        default=True,
        description=(
            "Start a new member on a dead member's address, and give it its share back (its "
            "subscribers are handed over, make before break); false: the survivors keep it."
        ),
    )
    check_every: Annotated[Duration, within(ZERO, 10 * SECOND)] = Field(
        default=timedelta(milliseconds=200),
        description="How often the tier looks for a member that died.",
    )
    round: Annotated[Duration, within(ZERO, SECOND)] = Field(
        default=timedelta(milliseconds=10),
        description="How often each member takes its upstream's batches and serves.",
    )

    metrics: MetricsListenConfig = Field(
        default=MetricsListenConfig(),
        description=(
            "Each member's Prometheus metrics: member ``i`` (the ``i``-th of ``members``, and "
            "its replacements) serves ``http://ADDRESS:PORT+i/metrics`` (no port: none)."
        ),
    )

    _durations = parsed_durations("check_every", "round")

    @model_validator(mode="after")
    def _metrics_ports(self) -> IntermediaryTierConfig:
        if self.metrics.port is None:
            return self
        last = self.metrics.port + len(self.members) - 1
        if last > 65535:
            raise ValueError(
                f"metrics.port: {len(self.members)} members need ports {self.metrics.port}.."
                f"{last}, past 65535"
            )
        for member in self.members:
            if self.metrics.port <= int(member.rpartition(":")[2]) <= last:
                raise ValueError(
                    f"metrics.port: the members' metrics ports {self.metrics.port}..{last} "
                    f"take the port of member {member}"
                )
        return self

    @field_validator("members")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        for member in v:
            if v.count(member) > 1:
                raise ValueError(f"member {member!r} is listed twice")
        return v

    @model_validator(mode="after")
    def _peer_tls_needs_tls(self) -> IntermediaryTierConfig:
        if self.peer_tls is not None and self.tls is None:
            raise ValueError("peer_tls: the members serve plaintext (no tls), so it is unused")
        self.check_tables([])
        return self

    @model_validator(mode="after")
    def _slots_for_everyone(self) -> IntermediaryTierConfig:
        axes = len(self.spatial.world_lo)
        cells = self.responsibility.cells
        if self.responsibility.by == "region" and cells is not None and len(cells) != axes:
            raise ValueError(
                f"responsibility.cells: the world has {axes} axes, so give {axes} numbers, "
                f"not {cells}"
            )
        slots = self.slot_count()
        if slots > MAX_SLOTS:
            raise ValueError(f"responsibility: {slots} slots, more than {MAX_SLOTS}")
        if slots < len(self.members):
            raise ValueError(
                f"responsibility: {slots} slot(s) for {len(self.members)} members; every member "
                "needs one at least (more cells or buckets, or fewer members)"
            )
        return self

    def grid(self) -> tuple[int, ...]:
        """The cells per axis (responsibility by region)."""
        if self.responsibility.cells is not None:
            return tuple(self.responsibility.cells)
        return (len(self.members),) + (1,) * (len(self.spatial.world_lo) - 1)

    def slot_count(self) -> int:
        if self.responsibility.by == "hash":
            return self.responsibility.buckets
        return math.prod(self.grid())
