"""The event-server target's configuration: which servers (one address, a list, or a Hat
Monitor's choice), how it fails over and resends, the stored type (prefix or template),
TLS and timeouts.

Apart from the target (:mod:`tidings.targets.kinds.event_server`) because the
configuration is loaded everywhere a ``tidings.yaml`` is checked, while the target, its
client and its resend window load only where events are published.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from tidings.address import Address, is_tls
from tidings.config import HOUR, ZERO, Duration, TargetConfig, parsed_durations, within
from tidings.config.tls import TlsClientConfig
from tidings.events.validation import WILDCARDS
from tidings.targets.destination import DestinationTemplate
from tidings.targets.kinds.event_store import unreserved_prefix
from tidings.targets.kinds.server_group import MonitorDiscoveryConfig

#: Where a target without ``address``, ``addresses`` or ``monitor`` publishes.
DEFAULT_ADDRESS = "tcp+sbs://127.0.0.1:23012"


class EventServerTargetConfig(TargetConfig):
    """A tidings event server over the network (the Eventer protocol, ``tcp+sbs://``, or
    ``ssl+sbs://`` over TLS).

    Events travel with their outbox event id (a tidings extension of the protocol), so the
    server stores each outbox event once however often it is published.
    """

    kind: Literal["event_server"] = Field(description="The target's kind: ``event_server``.")
    address: Address | None = Field(
        default=None,
        description=(
            "The Eventer address of the tidings event server (its ``eventer_server``); "
            f"``{DEFAULT_ADDRESS}`` if neither this, ``addresses`` nor ``monitor`` is given."
        ),
    )
    addresses: list[Address] | None = Field(
        default=None,
        description=(
            "Instead of ``address``: the Eventer addresses of a redundant group of servers, in "
            "the order they are tried; the first that accepts is used until it is lost."
        ),
    )
    monitor: MonitorDiscoveryConfig | None = Field(
        default=None,
        description=(
            "Instead of ``address``: find the server through a Hat Monitor Server, as "
            "hat-event clients do (with ``BLESS_ONE``, the blessed server of the group)."
        ),
    )
    failover_wait: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=2),
        description=(
            "How long a call waits for some server of the group to accept a connection "
            "(going round the addresses again) before the target counts as down and the "
            "relay holds its events; bounded by ``timeout``."
        ),
    )
    failover_resend: Annotated[Duration, within(ZERO, HOUR, zero=True)] = Field(
        default=timedelta(seconds=10),
        description=(
            "How far back, on a new connection (after its server was lost), the target sends "
            "again the events confirmed before, ahead of the call it is making: the time the "
            "servers' Syncer may take to copy an event to its peers. Counted back from the "
            "newest confirmation the outbox log records at this target (whichever relay "
            "process made it), so a relay that takes over later still covers the last "
            "moments of a server that died with its predecessor. ``0s`` sends nothing again."
        ),
    )
    failover_resend_events: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description=(
            "At most this many confirmed events are sent again (the oldest are left out); "
            "past it, the ``failover_resend`` window is shorter."
        ),
    )
    failover_resend_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        le=2**30,
        description=(
            "At most about this many bytes of confirmed events are sent again (the oldest are "
            "left out); past it, the ``failover_resend`` window is shorter."
        ),
    )
    type_prefix: list[str] = Field(
        default_factory=list,
        description="Segments put before the event type: the stored type is ``[*prefix, type]``.",
    )
    type_template: list[str] | None = Field(
        default=None,
        description=(
            "Instead of ``type_prefix``: one template per segment of the stored type, e.g. "
            '``[orders, "{headers.aggregate_type}", "{event_type}"]``.'
        ),
    )
    tls: TlsClientConfig | None = Field(
        default=None,
        description=(
            "For servers at ``ssl+sbs://`` addresses: the CA their certificates are checked "
            "against (absent: the system's CAs) and the client certificate presented to a "
            "server with mutual TLS (its CN is the relay's identity there)."
        ),
    )
    timeout: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=10),
        description=(
            "How long one registration request may take once connected (connecting is "
            "bounded by ``failover_wait``)."
        ),
    )

    _durations = parsed_durations("timeout", "failover_wait", "failover_resend")

    @field_validator("type_template")
    @classmethod
    def _template(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            if not v:
                raise ValueError("a type_template needs at least one segment")
            for segment in v:
                template = segment_template(segment)
                if not template.fields and (why := segment_problem(segment)) is not None:
                    raise ValueError(f"segment {segment!r} is {why}")
            literal = []
            for segment in v:
                if segment_template(segment).fields:
                    break
                literal.append(segment)
            unreserved_prefix(literal, "type_template")
        return v

    _prefix = field_validator("type_prefix")(lambda cls, v: unreserved_prefix(v))

    @field_validator("addresses")
    @classmethod
    def _some_addresses(cls, v: list[Address] | None) -> list[Address] | None:
        if v is not None:
            if not v:
                raise ValueError("addresses needs at least one address (or leave it out)")
            if len(set(v)) < len(v):
                raise ValueError(f"addresses lists an address twice: {v}")
        return v

    @model_validator(mode="after")
    def _prefix_or_template(self) -> EventServerTargetConfig:
        if self.type_template is not None and self.type_prefix:
            raise ValueError("set type_prefix or type_template, not both")
        given = [
            key for key in ("address", "addresses", "monitor") if getattr(self, key) is not None
        ]
        if len(given) > 1:
            raise ValueError(f"set one of address, addresses or monitor, not {' and '.join(given)}")
        plain = not any(is_tls(address) for address in self.server_addresses)
        if self.tls is not None and self.monitor is None and plain:
            raise ValueError("tls is set, but no address is ssl+sbs://")
        return self

    @property
    def server_addresses(self) -> list[str]:
        """The Eventer addresses configured, in order (none with ``monitor``)."""
        if self.monitor is not None:
            return []
        return list(self.addresses or [self.address or DEFAULT_ADDRESS])


def segment_problem(value: str) -> str | None:
    """Why ``value`` cannot be (part of) a server event type segment, or None."""
    if not value:
        return "empty, and an event type segment cannot be"
    if value in WILDCARDS:
        return "a query wildcard, reserved in event types"
    return None


def segment_template(text: str) -> DestinationTemplate:
    """One ``type_template`` segment, parsed (ValueError names a bad placeholder)."""
    return DestinationTemplate(text, segment_problem)
