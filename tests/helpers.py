"""Helpers shared by the test modules."""

from __future__ import annotations

from pathlib import Path

from tidings.config import TidingsConfig, load_config


def relay_config(
    workdir: Path,
    database_url: str | None = None,
    *,
    targets: dict | None = None,
    routes: dict | None = None,
    **relay: object,
) -> TidingsConfig:
    """A configuration for a test: SQLite in ``workdir`` unless a URL is given."""
    store = f"sqlite:///{workdir / 'events.db'}"
    return load_config(
        {
            "database": {"url": database_url or f"sqlite:///{workdir / 'app.db'}"},
            "targets": targets
            if targets is not None
            else {"store": {"kind": "event_store", "url": store, "type_prefix": ["t"]}},
            "routing": {"routes": routes if routes is not None else {"Created": ["store"]}},
            "relay": {"checkpoint_dir": str(workdir / "checkpoint"), "partitions": 2, **relay},
        }
    )
