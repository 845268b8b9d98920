"""tidings: every change a service makes to its database, out to everyone who needs it.

The flow, bottom to top of the layers: a service emits events into the outbox in its own
transaction (:class:`Outbox`); the relay on Spark routes them by type to targets, among
them the event server, which stores, serves and syncs them; clients
(:mod:`tidings.client`) register, query and subscribe. This package is the public face of
that flow, what a user imports::

    from tidings import Outbox, make_engine

    outbox = Outbox(make_engine("sqlite:///bank.db"))

The event model and the errors are loaded with the package: they are the bottom layers and
light. The names above them (the outbox, the configuration, engines, the event store) load
SQLAlchemy and pydantic, so they are imported on first use (PEP 562): ``import tidings.client``
runs this file first and must stay free of the database stack. The configuration's names
bring the target registry with them, since a configuration that names targets validates
only once the target kinds are known (:mod:`tidings.targets.registry` says why).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tidings.errors import (
    AccessDenied,
    AccessRefused,
    ClientError,
    ConfigError,
    ConnectionClosed,
    EmitError,
    EngineError,
    HatImportError,
    HousekeepingError,
    IntermediaryError,
    ModuleLoadError,
    ProtocolError,
    RelayError,
    ReplyTooLarge,
    RequestTimeout,
    SchemaError,
    StoreBusy,
    StoreError,
    StreamError,
    StreamRefused,
    SubscriptionRefused,
    TargetCallFailed,
    TargetError,
    TargetUnavailable,
    TidingsError,
    TlsError,
    TransactionDoomed,
    UsageError,
)
from tidings.events import (
    EventId,
    EventStatus,
    EventType,
    NewEvent,
    OutboxEvent,
    PayloadKind,
    QueryData,
    StoredEvent,
)

if TYPE_CHECKING:  # the names _LAZY resolves, for type checkers and editors
    from tidings.config import OutboxConfig, TidingsConfig, load_config, load_config_file
    from tidings.db import make_engine
    from tidings.outbox.envelope import EventDraft, json_default
    from tidings.outbox.incomplete import EventFilter, IncompleteEvents
    from tidings.outbox.producer import Outbox, OutboxTransaction
    from tidings.server.store import EventStore
    from tidings.targets.routed import incomplete_events_from_config, outbox_from_config

#: Each name exported on first use, and the module that defines it.
_LAZY = {
    "EventDraft": "tidings.outbox.envelope",
    "EventFilter": "tidings.outbox.incomplete",
    "IncompleteEvents": "tidings.outbox.incomplete",
    "incomplete_events_from_config": "tidings.targets.routed",
    "EventStore": "tidings.server.store",
    "Outbox": "tidings.outbox.producer",
    "OutboxConfig": "tidings.config",
    "OutboxTransaction": "tidings.outbox.producer",
    "TidingsConfig": "tidings.config",
    "load_config": "tidings.config",
    "load_config_file": "tidings.config",
    "json_default": "tidings.outbox.envelope",
    "make_engine": "tidings.db",
    "outbox_from_config": "tidings.targets.routed",
}
#: Names that validate configurations: they need the target kinds entered first.
_WITH_TARGET_KINDS = frozenset({"TidingsConfig", "load_config", "load_config_file"})

__all__ = [
    "AccessDenied",
    "AccessRefused",
    "ClientError",
    "ConfigError",
    "ConnectionClosed",
    "EmitError",
    "EngineError",
    "EventDraft",
    "EventFilter",
    "EventId",
    "EventStatus",
    "EventStore",
    "EventType",
    "HatImportError",
    "HousekeepingError",
    "IncompleteEvents",
    "IntermediaryError",
    "ModuleLoadError",
    "NewEvent",
    "Outbox",
    "OutboxConfig",
    "OutboxEvent",
    "OutboxTransaction",
    "PayloadKind",
    "ProtocolError",
    "QueryData",
    "RelayError",
    "ReplyTooLarge",
    "RequestTimeout",
    "SchemaError",
    "StoreBusy",
    "StoreError",
    "StoredEvent",
    "StreamError",
    "StreamRefused",
    "SubscriptionRefused",
    "TargetCallFailed",
    "TargetError",
    "TargetUnavailable",
    "TidingsConfig",
    "TidingsError",
    "TlsError",
    "TransactionDoomed",
    "UsageError",
    "incomplete_events_from_config",
    "json_default",
    "load_config",
    "load_config_file",
    "make_engine",
    "outbox_from_config",
]


def __getattr__(name: str) -> Any:
    """Import the module of a lazily exported name on first use, then keep the name here."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tidings' has no attribute {name!r}")
    if name in _WITH_TARGET_KINDS:
        importlib.import_module("tidings.targets.registry")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
