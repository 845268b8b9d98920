"""Event server backends, chosen by Python module path in ``backend.module`` (as in Hat).

A backend module defines ``create(options: dict, server_id: int, base_dir: Path) ->
EventStore``: ``options`` are the ``backend`` keys other than ``module``, and relative paths
are resolved against ``base_dir`` (the configuration file's directory). There is no
default backend: a configuration names its module. tidings ships
:mod:`~tidings.server.backends.sqlite` (one SQLite file) and
:mod:`~tidings.server.backends.postgresql`; both are the same :class:`EventStore` over
SQLAlchemy, so they answer every query the same way.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from tidings.errors import ConfigError
from tidings.server.store import EventStore


def open_backend(
    module: str, options: dict[str, Any], server_id: int, base_dir: Path
) -> EventStore:
    """Import backend ``module`` and open its store."""
    try:
        backend = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"backend.module: cannot import {module!r}: {exc}") from exc
    create = getattr(backend, "create", None)
    if not callable(create):
        raise ConfigError(
            f"backend.module: {module!r} has no create(options, server_id, base_dir) function"
        )
    store = create(options, server_id, base_dir)
    if not isinstance(store, EventStore):
        raise ConfigError(
            f"backend.module: {module!r} create() returned {type(store).__name__}, "
            "not an EventStore"
        )
    return store
