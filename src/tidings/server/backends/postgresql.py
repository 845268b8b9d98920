"""PostgreSQL backend: events in a PostgreSQL database (``url``, e.g. postgresql://host/db)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from tidings.config import StrictModel, validate_config
from tidings.server.store import EventStore


class PostgresqlBackendConfig(StrictModel):
    url: str = Field(pattern=r"^postgresql(\+psycopg)?://")


def create(options: dict[str, Any], server_id: int, base_dir: Path) -> EventStore:
    del base_dir  # nothing local to resolve
    config = validate_config(PostgresqlBackendConfig, options, "backend (postgresql)")
    return EventStore(config.url, server_id=server_id)
