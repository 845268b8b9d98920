"""The configuration of a ``rabbitmq_stream`` target: its brokers, streams, producer pool,
credentials and TLS.

Checked when the configuration is read, not at first publish: a URL that is not a stream
URL, a stream template with an unknown placeholder, a lease no longer than the confirm
timeout (a sender could lose its reference while waiting for a confirm), TLS files that are
not there, TLS options for a plain broker.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, field_validator, model_validator

from tidings.config import HOUR, SECOND, ZERO, Duration, TargetConfig, parsed_durations, within
from tidings.config.tls import TlsClientConfig
from tidings.targets.kinds.rabbitmq.config import RabbitMQLogin
from tidings.targets.kinds.rabbitmq_stream.messages import (
    DEFAULT_FRAME_MAX,
    MAX_STREAM_NAME,
    MIN_FRAME_MAX,
    stream_template,
)

#: The URL schemes of RabbitMQ's stream protocol (those of its Java client).
PLAIN, TLS = "rabbitmq-stream", "rabbitmq-stream+tls"
#: The ports the broker listens on by default, for each scheme.
DEFAULT_PORTS = {PLAIN: 5552, TLS: 5551}


class RabbitMQStreamTargetConfig(TargetConfig, RabbitMQLogin):
    """RabbitMQ streams, exactly once through producer de-duplication; each event's stream
    comes from ``stream`` (:mod:`tidings.targets.destination`)."""

    kind: Literal["rabbitmq_stream"] = Field(description="The target's kind: ``rabbitmq_stream``.")
    servers: list[str] = Field(
        default_factory=lambda: ["rabbitmq-stream://127.0.0.1:5552/"],
        min_length=1,
        description=(
            "The brokers' stream-protocol URLs (``rabbitmq-stream://host:5552/vhost``, or "
            "``rabbitmq-stream+tls://host:5551/vhost`` for TLS), tried in order; the virtual "
            "host is the path (``/`` or empty: the default ``/``, ``%2F`` for a slash in a name)."
        ),
    )
    stream: str = Field(
        description=(
            "The stream of each event, a template: text with placeholders such as "
            "``{event_type}``, ``{headers.NAME}``, ``{payload.FIELD}``; at most 255 bytes once "
            "filled."
        ),
    )
    create_stream: bool = Field(
        default=False,
        description=(
            "Create a missing stream (with the broker's default retention); ``false``: it must "
            "exist, and the target is unavailable, its events held, until it does."
        ),
    )
    producers: int = Field(
        default=4,
        ge=1,
        le=64,
        description=(
            "The producer references per stream (``<target>.producer-0`` ...): each relay process "
            "sending to a stream holds one; a few spare ones let a restarted relay go on while "
            "the references of one that died cool down (``producer_lease``)."
        ),
    )
    producer_lease: Annotated[Duration, within(SECOND, HOUR)] = Field(
        default=timedelta(seconds=15),
        description=(
            "How long a producer reference stays its sender's after its last send; one whose "
            "sender died or lost its connection is reconciled only once this has passed, by "
            "when the broker has stored or dropped everything that sender sent."
        ),
    )
    confirm_timeout: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=5),
        description=(
            "How long one connection attempt may take; and the sending of a batch with the "
            "wait for its confirms, counted from the lease renewal before it (a batch not "
            "through by then is cut off: the connection is reset, the reference abandoned)."
        ),
    )
    frame_max: int = Field(
        default=DEFAULT_FRAME_MAX,
        ge=MIN_FRAME_MAX,
        description=(
            "The largest frame the connection asks for (the broker may lower it, to its "
            "``stream.frame_max``); a message must fit in one frame, so a larger one is refused "
            "when it is emitted."
        ),
    )
    tls: TlsClientConfig | None = Field(
        default=None,
        description=(
            "TLS to ``rabbitmq-stream+tls://`` brokers: the CA that signed their certificates "
            "(absent: the system's CAs) and a client certificate for brokers that verify "
            "peers."
        ),
    )

    _durations = parsed_durations("producer_lease", "confirm_timeout")

    @field_validator("servers")
    @classmethod
    def _stream_urls(cls, v: list[str]) -> list[str]:
        for url in v:
            try:
                parts = urlsplit(url)
                _ = parts.port  # a bad port raises here
            except ValueError as exc:
                raise ValueError(f"{url!r} is not a URL: {exc}") from None
            if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
                raise ValueError(
                    f"{url!r} is not a RabbitMQ stream URL (rabbitmq-stream://host:5552/vhost "
                    "or rabbitmq-stream+tls://host:5551/vhost)"
                )
            if parts.query or parts.fragment:
                raise ValueError(
                    f"{url!r}: give TLS and other options as the target's keys, not in the URL"
                )
        return v

    @field_validator("stream")
    @classmethod
    def _template(cls, v: str) -> str:
        template = stream_template(v)
        if not template.literal_shape("x"):
            raise ValueError("the stream template is empty")
        if len(template.literal_shape("").encode()) > MAX_STREAM_NAME:
            raise ValueError(f"the stream's fixed text is over {MAX_STREAM_NAME} bytes")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> RabbitMQStreamTargetConfig:
        schemes = {urlsplit(url).scheme for url in self.servers}
        if self.tls is not None and schemes != {TLS}:
            raise ValueError(f"tls is set: every server must be a {TLS}:// URL")
        if self.producer_lease <= self.confirm_timeout:
            raise ValueError(
                "producer_lease must be longer than confirm_timeout: a sender waiting for "
                "confirms must still hold its producer reference"
            )
        return self


def server_address(url: str) -> tuple[str, int, str]:
    """``url``'s host, port and virtual host."""
    parts = urlsplit(url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return parts.hostname or "", parts.port or DEFAULT_PORTS[parts.scheme], vhost
