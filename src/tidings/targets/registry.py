"""Building targets from configuration, once per process.

Spark reuses its Python workers across tasks, so a target (a database engine, a NATS
connection) is built on first use in a worker and then shared by every later task there.
"""

from __future__ import annotations

import threading

from tidings.config import (
    EventServerTargetConfig,
    EventStoreTargetConfig,
    JetStreamTargetConfig,
    TargetConfig,
)
from tidings.targets.base import Target
from tidings.targets.faults import FaultInjectingTarget

_cache: dict[tuple[str, str], Target] = {}
_lock = threading.Lock()


def build_target(name: str, config: TargetConfig) -> Target:
    """A new target for ``config``."""
    target: Target
    if isinstance(config, EventStoreTargetConfig):
        from tidings.targets.event_store import EventStoreTarget

        target = EventStoreTarget(name, config)
    elif isinstance(config, JetStreamTargetConfig):
        from tidings.targets.jetstream import JetStreamTarget

        target = JetStreamTarget(name, config)
    elif isinstance(config, EventServerTargetConfig):
        from tidings.targets.event_server import EventServerTarget

        target = EventServerTarget(name, config)
    else:  # pragma: no cover - the config model admits no other kind
        raise TypeError(f"unknown target config {config!r}")
    if config.fault_file:
        target = FaultInjectingTarget(target, config.fault_file)
    return target


def shared_target(name: str, config: TargetConfig) -> Target:
    """The process-wide target for this name and configuration."""
    key = (name, config.model_dump_json())
    with _lock:
        target = _cache.get(key)
        if target is None:
            target = _cache[key] = build_target(name, config)
        return target
