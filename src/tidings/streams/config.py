"""The streams' configuration models, where the README names them: they live in
:mod:`tidings.config.streams`, with the rest of the configuration."""

from tidings.config.streams import (
    AggregateConfig,
    AggregateDestination,
    PushConfig,
    RetentionConfig,
    StreamConfig,
    StreamServerConfig,
    StreamSourceConfig,
    StreamUserConfig,
    load_stream_server_config,
    load_stream_server_config_file,
)

__all__ = [
    "AggregateConfig",
    "AggregateDestination",
    "PushConfig",
    "RetentionConfig",
    "StreamConfig",
    "StreamServerConfig",
    "StreamSourceConfig",
    "StreamUserConfig",
    "load_stream_server_config",
    "load_stream_server_config_file",
]
