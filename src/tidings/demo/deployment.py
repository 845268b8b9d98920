"""The demo's deployment: one ``tidings.yaml`` holding the whole chain on this machine.

The bank's outbox (a SQLite file) is relayed by local Spark to an event server (``main``,
SQLite store, with the demo's module) through an ``event_server`` target; the server serves
the bank's events as an FTN18 stream, and an intermediary follows it, serving event views
and a SQL view over the ``account`` table fed by row events. Ports are chosen free when the
demo starts, so it runs beside anything else; the file is written into the demo's directory,
where a user can read it and run it again with ``tidings run``.
"""

from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tidings.config import TidingsConfig, load_config_file
from tidings.config.passwords import hash_password
from tidings.demo.alerts import DEFAULT_THRESHOLD

#: The prefix the event server gives the bank's events (the target's ``type_prefix``).
PREFIX = "bank"
#: FTN18 type name -> the outbox type it carries (all under PREFIX on the server).
STREAM_TYPES = {
    "ACCOUNT_OPENED": "AccountOpened",
    "MONEY_DEPOSITED": "MoneyDeposited",
    "MONEY_WITHDRAWN": "MoneyWithdrawn",
    "LIMIT_CHANGED": "LimitChanged",
    "STATEMENT_VIEWED": "StatementViewed",
}
STREAM_USER = "demo"


@dataclass(frozen=True)
class Deployment:
    """The written file, what it says, and what the demo's clients need to reach the parts."""

    path: Path
    config: TidingsConfig
    stream_url: str
    stream_password: str
    intermediary_url: str

    @property
    def server_address(self) -> str:
        return self.config.servers["main"].eventer_server.address


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def deployment_data(password_hash: str, ports: dict[str, int]) -> dict[str, Any]:
    """The demo's ``tidings.yaml`` as a mapping (paths relative to the file)."""
    eventer = f"tcp+sbs://127.0.0.1:{ports['eventer']}"
    routes: dict[str, list[str]] = {kind: ["server"] for kind in STREAM_TYPES.values()}
    routes["rows.account"] = ["server"]
    routes["DemoStarted"] = ["server"]  # the warm-up event: stored, not streamed
    return {
        "database": {"url": "sqlite:///bank.db"},
        "outbox": {"originator": "demo-bank"},
        "targets": {
            "server": {"kind": "event_server", "address": eventer, "type_prefix": [PREFIX]},
        },
        "routing": {"routes": routes},
        "relay": {"checkpoint_dir": "checkpoint", "trigger_interval": "50ms"},
        "servers": {
            "main": {
                "backend": {"module": "tidings.server.backends.sqlite", "db_path": "events.db"},
                "engine": {
                    "server_id": 1,
                    "modules": [{"module": "tidings.demo.alerts", "threshold": DEFAULT_THRESHOLD}],
                },
                "eventer_server": {"address": eventer},
                "stream_users": {STREAM_USER: {"password_hash": password_hash}},
                "streams": [
                    {
                        "name": "bank",
                        "port": ports["stream"],
                        "path": "/bank",
                        "types": {name: [PREFIX, kind] for name, kind in STREAM_TYPES.items()},
                    }
                ],
            }
        },
        "intermediaries": {
            "live": {
                "listen": f"127.0.0.1:{ports['intermediary']}",
                "event_server": eventer,
                "row_type_prefix": [PREFIX],
                "tables": {
                    "account": {
                        "columns": {"id": "text", "balance": "integer", "lim": "integer"},
                        "keyed_by": "id",
                    }
                },
            }
        },
    }


def write_deployment(workdir: Path) -> Deployment:
    """Write the demo's ``tidings.yaml`` into ``workdir`` (free ports, a fresh stream password)
    and load it back, as every part will."""
    password = secrets.token_urlsafe(12)
    ports = {name: _free_port() for name in ("eventer", "stream", "intermediary")}
    path = workdir / "tidings.yaml"
    header = (
        "# The tidings demo's deployment, written by `tidings demo`: run it again with\n"
        "#   tidings run -c tidings.yaml\n"
    )
    body = yaml.safe_dump(deployment_data(hash_password(password), ports), sort_keys=False)
    path.write_text(header + body)
    config = load_config_file(path)
    stream = config.servers["main"].streams[0]
    return Deployment(
        path,
        config,
        stream.endpoint,
        password,
        f"ws://127.0.0.1:{ports['intermediary']}/",
    )
