"""The configuration of an MQTT target: its broker, topics, protocol version and security.

Checked when the configuration is read: a topic template with an unknown placeholder or a
wildcard, a TLS file that is not there, an environment variable name that cannot be one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from tidings.config import HOUR, ZERO, Duration, TargetConfig, parsed_durations, within
from tidings.config.tls import TlsClientConfig
from tidings.targets.kinds.mqtt.messages import topic_template
from tidings.targets.secrets import ENV_NAME


class MqttTargetConfig(TargetConfig):
    """An MQTT broker: every event is a QoS 1 PUBLISH to the topic its ``topic`` names."""

    kind: Literal["mqtt"] = Field(description="The target's kind: ``mqtt``.")
    host: str = Field(default="127.0.0.1", min_length=1, description="The broker's host.")
    port: int = Field(
        default=1883, ge=1, le=65535, description="The broker's port (often 8883 with TLS)."
    )
    topic: str = Field(
        min_length=1,
        description=(
            "The topic each event is published to, a destination template: "
            "``orders/{event_type}``, or ``state/orders/{partition_key}`` with ``retain``; "
            "each placeholder's value must be one topic level."
        ),
    )
    retain: bool = Field(
        default=False,
        description=(
            "Publish retained: the broker keeps the latest message per topic and gives it to "
            "every new subscriber, so a topic per key (``{partition_key}``) holds each key's "
            "latest state."
        ),
    )
    protocol: Literal["5", "3.1.1"] = Field(
        default="5",
        description=(
            "The MQTT version: ``5`` carries the event's fields and headers as user properties "
            "and says why a message is refused; ``3.1.1`` for brokers without MQTT 5."
        ),
    )
    client_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=23,
        description=(
            "The client id (None: ``tidings-`` and random letters, one per connection). A "
            "fixed id must be unique: the broker drops the older of two connections with one."
        ),
    )
    username: str | None = Field(default=None, min_length=1, description="The broker user.")
    password_env: str | None = Field(
        default=None,
        pattern=ENV_NAME,
        description="The environment variable holding the user's password, read at each connect.",
    )
    tls: TlsClientConfig | None = Field(
        default=None,
        description=(
            "TLS to the broker: the CA that signed its certificate (absent: the system's CAs) "
            "and a client certificate for brokers that require one "
            "(``require_certificate true``); None: no TLS."
        ),
    )
    max_message_bytes: int | None = Field(
        default=None,
        ge=1,
        description=(
            "The largest payload the broker takes (Mosquitto's ``message_size_limit``, which "
            "it does not announce); a larger event is refused at emit. The broker's Maximum "
            "Packet Size (announced over MQTT 5) is checked as well."
        ),
    )
    timeout: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=5),
        description="How long connecting, and waiting for one round of PUBACKs, may take.",
    )

    _durations = parsed_durations("timeout")

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        topic_template(v)
        return v

    @model_validator(mode="after")
    def _tls_name(self) -> MqttTargetConfig:
        if self.tls is not None and self.tls.server_name is not None:
            raise ValueError(
                "tls.server_name is not supported by the mqtt target (paho-mqtt checks the "
                "certificate against host): set host to the name the certificate holds"
            )
        return self
