"""The console's tests' deployment: an outbox, an event-store target the relay's publishing
core (no Spark) delivers to, with a target that refuses the events whose payload says
"poison" (:class:`tests.support.publisher_helpers.Refusing`, the one fault a real store
cannot be made to produce), and the console's users."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import Engine

import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names
from bench.harness.processes import free_port
from tests.support.publisher_helpers import Refusing, emit_all, local_store, logged_rows
from tidings.config import TidingsConfig, load_config, load_config_file
from tidings.config.passwords import hash_password
from tidings.console.app import ConsoleState, build_app
from tidings.console.overview import take_overview
from tidings.console.runner import RunningConsole, close_state, console_state, record
from tidings.db import make_engine
from tidings.pipeline.publishing.publisher import Publisher
from tidings.routing.table import current_routes

#: The users: an operator and a read-only user (cheap scrypt: these are tests).
PASSWORDS = {"olga": "op-secret", "rita": "read-secret"}
USERS = {
    "olga": {"password_hash": hash_password("op-secret", n=2**4), "role": "operator"},
    "rita": {"password_hash": hash_password("read-secret", n=2**4), "role": "read"},
}


def deployment(
    tmp_path: Path, database_url: str, sections: dict[str, Any] | None = None, **console: Any
) -> TidingsConfig:
    """A file's worth of configuration: orders routed to the store target, the console (and
    the other ``sections`` given)."""
    return load_config(
        {
            **(sections or {}),
            "database": {"url": database_url},
            "targets": {
                "store": {
                    "kind": "event_store",
                    "url": f"sqlite:///{tmp_path / 'store.db'}",
                    "type_prefix": ["store"],
                }
            },
            "routing": {"routes": {"orders.*": ["store"]}},
            "console": {
                "users": USERS,
                "audit_file": str(tmp_path / "audit.sqlite"),
                "port": 8480,
                **console,
            },
        }
    )


class Deployment:
    """The outbox, its relay's publishing core and the console's state."""

    def __init__(
        self,
        tmp_path: Path,
        database_url: str,
        sections: dict[str, Any] | None = None,
        **console: Any,
    ) -> None:
        self.config = deployment(tmp_path, database_url, sections, **console)
        self.engine: Engine = make_engine(database_url)
        assert self.config.console is not None
        self.state: ConsoleState = console_state(self.config, self.config.console)
        self.refusing = Refusing("store", local_store(tmp_path, "store"), "poison")

    def emit(self, events: list[tuple[str, str | None, dict[str, Any]]]) -> None:
        emit_all(self.engine, events)

    def relay(self, runs: int = 1) -> None:
        """``runs`` publishing runs over the open rows, as the relay's carry-over does
        (three runs make a refused event FAILED for good)."""
        for _ in range(runs):
            rows = [r for r in logged_rows(self.engine) if r.status.value != "PUBLISHED"]
            routes = current_routes(self.config, self.engine)
            Publisher(
                self.engine, routes, {"store": self.refusing}.get, [0.0], retry_threshold=3
            ).run(rows)

    def sample(self) -> None:
        """The sampler's step, now."""
        record(self.state, take_overview(self.config, None, self.state.outbox.engine))

    def client(self) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=build_app(self.state))
        return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8480")

    def close(self) -> None:
        close_state(self.state)
        self.engine.dispose()


def hidden(page: str, name: str) -> str:
    """The value of a page's hidden field ``name`` (the first one)."""
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    assert found, f"no field {name} in the page"
    return found.group(1)


async def log_in(client: httpx.AsyncClient, user: str, password: str | None = None) -> str:
    """Log ``user`` in; the session's CSRF token."""
    form = await client.get("/login")
    reply = await client.post(
        "/login",
        data={
            "csrf": hidden(form.text, "csrf"),
            "next": "/",
            "user": user,
            "password": password or PASSWORDS[user],
        },
    )
    assert reply.status_code == 303, reply.text
    page = await client.get("/")
    return hidden(page.text, "csrf")


@contextlib.asynccontextmanager
async def serving(deployed: Deployment) -> AsyncIterator[str]:
    """The console of ``deployed`` on its real socket, sampling; its URL."""
    running = await RunningConsole.start(deployed.state, None)
    try:
        yield deployed.state.settings.url.rstrip("/")
    finally:
        await running.aclose()


def with_servers(
    tmp_path: Path, up: int, down: int, *, retention: bool = False, **console: Any
) -> TidingsConfig:
    """A file with two event servers, ``main`` (its Eventer on ``up``) and ``spare``, each
    with a stream ``orders``, and the console: loaded from its path in ``tmp_path``."""

    def server(port: int, db: str) -> dict[str, Any]:
        return {
            "backend": {"module": "tidings.server.backends.sqlite", "db_path": db},
            "engine": {"server_id": 1},
            "eventer_server": {"address": f"tcp+sbs://127.0.0.1:{port}"},
            "stream_users": {"app": {"password_hash": hash_password("pw", n=2**4)}},
            "streams": [
                {
                    "name": "orders",
                    "port": free_port(),
                    "path": "/o",
                    "types": {"A": ["a"]},
                    "retention": {"enabled": retention},
                }
            ],
        }

    data = {
        "database": {"url": f"sqlite:///{tmp_path / 'outbox.db'}"},
        "servers": {"main": server(up, "main.db"), "spare": server(down, "spare.db")},
        "console": {"users": USERS, "audit_file": str(tmp_path / "audit.sqlite"), **console},
    }
    path = tmp_path / "tidings.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config_file(path)
