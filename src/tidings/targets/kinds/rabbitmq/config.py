"""The configuration of a RabbitMQ (AMQP 0-9-1) target: its brokers, exchange, routing keys,
credentials and TLS.

Checked when the configuration is read, not at first publish: a URL that is not AMQP, a
routing-key template with an unknown placeholder or longer than AMQP allows, TLS files that
are not there, TLS options for a plain ``amqp://`` broker.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from tidings.config import HOUR, ZERO, Duration, TargetConfig, parsed_durations, within
from tidings.config.model import StrictModel
from tidings.config.tls import TlsClientConfig
from tidings.targets.kinds.rabbitmq.messages import (
    DEFAULT_MAX_MESSAGE_SIZE,
    MAX_SHORTSTR,
    routing_key_template,
)

#: RabbitMQ's own ceiling for ``max_message_size`` (512 MiB).
_LARGEST_MESSAGE = 512 * 1024 * 1024


class RabbitMQLogin(StrictModel):
    """The login keys both RabbitMQ kinds take beside their URLs (a section inherits them)."""

    username: str | None = Field(
        default=None,
        min_length=1,
        description="The user to log in as, instead of one in the URLs (absent: ``guest``).",
    )
    password: str | None = Field(
        default=None,
        description=(
            "The user's password, instead of one in the URLs; write ``${VARIABLE}`` to read it "
            "from the environment."
        ),
    )


class RabbitMQTargetConfig(TargetConfig, RabbitMQLogin):
    """An exchange of a RabbitMQ broker; each event's routing key comes from
    ``routing_key`` (:mod:`tidings.targets.destination`)."""

    kind: Literal["rabbitmq"] = Field(description="The target's kind: ``rabbitmq``.")
    servers: list[str] = Field(
        default_factory=lambda: ["amqp://127.0.0.1:5672/"],
        min_length=1,
        description=(
            "The brokers' URLs (``amqp://host:port/vhost``, or ``amqps://`` for TLS), tried in "
            "order; the virtual host is the path (``/`` or empty: the default ``/``, ``%2F`` "
            "for a slash in a name)."
        ),
    )
    exchange: str = Field(
        default="",
        max_length=MAX_SHORTSTR,
        pattern=r"^[A-Za-z0-9_.:-]*$",
        description=(
            "The exchange to publish to; empty: the default exchange, where a routing key is a "
            "queue's name."
        ),
    )
    exchange_type: Literal["direct", "topic", "fanout", "headers"] | None = Field(
        default=None,
        description=(
            "Declare the exchange (durable) with this type if it does not exist; absent: it "
            "must exist (the target is unavailable, its events held, until it does). An "
            "existing exchange of another type keeps the target unavailable."
        ),
    )
    routing_key: str = Field(
        default="{event_type}",
        description=(
            "The routing key, a template: text with placeholders such as ``{event_type}``, "
            "``{partition_key}``, ``{headers.NAME}``, ``{payload.FIELD}``; at most 255 bytes "
            "once filled."
        ),
    )
    mandatory: bool = Field(
        default=True,
        description=(
            "Publish with the ``mandatory`` flag: a message no queue takes is returned and "
            "that event fails. ``false``: the broker confirms it and drops it."
        ),
    )
    persistent: bool = Field(
        default=True,
        description=(
            "Delivery mode 2: durable queues keep the message across a broker restart (the "
            "confirm then comes once it is on disk)."
        ),
    )
    confirm_timeout: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=5),
        description=(
            "How long one connection attempt, and the wait for one message's confirm, may take."
        ),
    )
    max_message_size: int = Field(
        default=DEFAULT_MAX_MESSAGE_SIZE,
        ge=1,
        le=_LARGEST_MESSAGE,
        description=(
            "The broker's ``max_message_size`` in bytes (RabbitMQ's default: 128 MiB); a "
            "larger payload is refused when it is emitted."
        ),
    )
    tls: TlsClientConfig | None = Field(
        default=None,
        description=(
            "TLS to ``amqps://`` brokers: the CA that signed their certificates (absent: the "
            "system's CAs) and a client certificate for brokers that verify peers; None with "
            "``amqps://``: the system's CAs."
        ),
    )

    _durations = parsed_durations("confirm_timeout")

    @field_validator("servers")
    @classmethod
    def _amqp_urls(cls, v: list[str]) -> list[str]:
        for url in v:
            try:
                parts = urlsplit(url)
                port = parts.port
            except ValueError as exc:
                raise ValueError(f"{url!r} is not a URL: {exc}") from None
            if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
                raise ValueError(
                    f"{url!r} is not an AMQP URL (amqp://host:port/vhost or amqps://...)"
                )
            if parts.query or parts.fragment:
                raise ValueError(
                    f"{url!r}: give TLS and other options as the target's keys, not in the URL"
                )
            del port
        return v

    @field_validator("routing_key")
    @classmethod
    def _template(cls, v: str) -> str:
        template = routing_key_template(v)
        if len(template.literal_shape("").encode()) > MAX_SHORTSTR:
            raise ValueError(f"the routing key's fixed text is over {MAX_SHORTSTR} bytes")
        return v

    @model_validator(mode="after")
    def _tls_for_amqps(self) -> RabbitMQTargetConfig:
        schemes = {urlsplit(url).scheme for url in self.servers}
        if self.tls is not None and schemes != {"amqps"}:
            raise ValueError("tls is set: every server must be an amqps:// URL")
        if self.exchange == "" and self.exchange_type is not None:
            raise ValueError("exchange_type needs an exchange name (the default exchange exists)")
        return self
