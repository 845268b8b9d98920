"""The parts one ``tidings.yaml`` configures, and how each runs alone.

A part is a process: the relay (when the file has targets), each event server under
``servers:`` (with its streams), each intermediary under ``intermediaries:``, the older
single ``intermediary:`` section when the file sets it, and each tier under
``intermediary_tiers:`` (one process supervising its members, which it starts and replaces
itself), and the operator's console when the file has ``console:``. Each runs from the same
file with the command a user would type (``tidings server -c FILE --name main``), so ``tidings run``
supervises exactly what systemd or Kubernetes would run one by one.

Order. Servers start first (the others connect to them) and the supervisor waits for their
Eventer ports before it starts the rest. They stop in the other order, clients before the
servers they use: intermediaries first, then the relay, which finishes its batch and so leaves
no event half-published, then the servers. No part sees its upstream vanish while it runs.

Needs. A part that follows a server of the file (an intermediary, the relay through an
``event_server`` target) *needs* it: the supervisor (re)starts it only while that server is
up, and an exit of it while the server was away is not held against it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tidings.address import Address
from tidings.config import TidingsConfig
from tidings.config.intermediary import IntermediaryConfig

PartKind = Literal["server", "relay", "intermediary", "console"]

#: Start rank per kind: lower starts first. Stop ranks: lower stops first.
START_RANK: dict[PartKind, int] = {"server": 0, "relay": 1, "intermediary": 1, "console": 1}
STOP_RANK: dict[PartKind, int] = {"console": 0, "intermediary": 0, "relay": 1, "server": 2}
#: Seconds a part may take to stop after SIGTERM before it is killed: the relay finishes its
#: micro-batch (and Spark its shutdown), the others close their connections.
STOP_GRACE_S: dict[PartKind, float] = {
    "server": 20.0,
    "relay": 60.0,
    "intermediary": 10.0,
    "console": 10.0,
}


@dataclass(frozen=True)
class Part:
    """One process of the deployment."""

    name: str
    kind: PartKind
    #: The whole command line that runs it alone.
    command: tuple[str, ...]
    #: ``(host, port)`` it is ready once it listens on (servers: their Eventer;
    #: intermediaries: their WebSocket); None: ready once started.
    ready_on: tuple[str, int] | None = None
    #: The names of the parts it follows (see the module docstring).
    needs: tuple[str, ...] = ()

    @property
    def start_rank(self) -> int:
        return START_RANK[self.kind]

    @property
    def stop_rank(self) -> int:
        return STOP_RANK[self.kind]

    @property
    def stop_grace_s(self) -> float:
        return STOP_GRACE_S[self.kind]


def tidings_command(*arguments: str) -> tuple[str, ...]:
    """``tidings ARGUMENTS`` with this interpreter (what a unit file would run)."""
    return (sys.executable, "-m", "tidings.cli", *arguments)


def host_port(address: Address | str) -> tuple[str, int]:
    """``tcp+sbs://HOST:PORT`` or ``HOST:PORT`` as a pair."""
    where = address.partition("://")[2] if "://" in address else address
    host, _, port = where.rpartition(":")
    return host.strip("[]"), int(port)


def parts_of(config: TidingsConfig, path: Path) -> list[Part]:
    """The parts ``config`` (read from ``path``) describes, in start order."""
    file = str(path)
    servers = {
        host_port(server.eventer_server.address): f"server.{name}"
        for name, server in config.servers.items()
    }

    def following(*addresses: str) -> tuple[str, ...]:
        return tuple(sorted({n for a in addresses if (n := servers.get(host_port(a)))}))

    parts = [
        Part(
            f"server.{name}",
            "server",
            tidings_command("server", "-c", file, "--name", name),
            host_port(server.eventer_server.address),
        )
        for name, server in config.servers.items()
    ]
    if config.targets:
        addresses = [
            str(address)
            for target in config.targets.values()
            if target.kind == "event_server"
            for address in getattr(target, "server_addresses", [])
        ]
        parts.append(
            Part(
                "relay", "relay", tidings_command("relay", "-c", file), None, following(*addresses)
            )
        )
    intermediaries: list[tuple[str, tuple[str, ...], IntermediaryConfig]] = []
    if "intermediary" in config.model_fields_set:
        intermediaries.append(("intermediary", (), config.intermediary))
    intermediaries.extend(
        (f"intermediary.{name}", ("--name", name), settings)
        for name, settings in config.intermediaries.items()
    )
    parts.extend(
        Part(
            name,
            "intermediary",
            tidings_command("intermediary", "serve", "-c", file, *chosen),
            host_port(settings.listen),
            following(*settings.event_servers),
        )
        for name, chosen, settings in intermediaries
    )
    parts.extend(
        Part(
            f"tier.{name}",
            "intermediary",
            tidings_command("intermediary", "serve", "-c", file, "--tier", name),
            host_port(tier.members[-1]),  # members start in order: the last one is up last
        )
        for name, tier in config.intermediary_tiers.items()
    )
    if config.console is not None:
        console = config.console
        parts.append(
            Part(
                "console",
                "console",
                tidings_command("console", "-c", file),
                (console.host, console.port),
            )
        )
    return sorted(parts, key=lambda part: part.start_rank)
