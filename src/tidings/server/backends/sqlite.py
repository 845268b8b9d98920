"""SQLite backend: events in one SQLite file (``db_path``, relative to the config file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from tidings.config import StrictModel, resolve_path, validate_config
from tidings.server.store import EventStore


class SqliteBackendConfig(StrictModel):
    db_path: str = Field(min_length=1)


def create(options: dict[str, Any], server_id: int, base_dir: Path) -> EventStore:
    config = validate_config(SqliteBackendConfig, options, "backend (sqlite)")
    path = resolve_path(config.db_path, base_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    return EventStore(f"sqlite:///{path}", server_id=server_id)
