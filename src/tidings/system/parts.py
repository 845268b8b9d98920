"""The parts one ``tidings.yaml`` configures, and how each runs alone.

A part is a process: the relay (when the file has targets), each event server under
``servers:`` (with its streams), each intermediary under ``intermediaries:``, and the older
single ``intermediary:`` section when the file sets it. Each runs from the same file with
the command a user would type (``tidings server -c FILE --name main``), so ``tidings run``
supervises exactly what systemd or Kubernetes would run one by one.

Order. Servers start first (the others connect to them) and the supervisor waits for their
Eventer ports before it starts the rest. They stop in the other order, clients before the
servers they use: intermediaries first, then the relay, which finishes its batch and so leaves
no event half-published, then the servers. No part sees its upstream vanish while it runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tidings.address import Address
from tidings.config import TidingsConfig

PartKind = Literal["server", "relay", "intermediary"]

#: Start rank per kind: lower starts first. Stop ranks: lower stops first.
START_RANK: dict[PartKind, int] = {"server": 0, "relay": 1, "intermediary": 1}
STOP_RANK: dict[PartKind, int] = {"intermediary": 0, "relay": 1, "server": 2}
#: Seconds a part may take to stop after SIGTERM before it is killed: the relay finishes its
#: micro-batch (and Spark its shutdown), the others close their connections.
STOP_GRACE_S: dict[PartKind, float] = {"server": 20.0, "relay": 60.0, "intermediary": 10.0}


@dataclass(frozen=True)
class Part:
    """One process of the deployment."""

    name: str
    kind: PartKind
    #: The ``tidings`` arguments that run it alone.
    arguments: tuple[str, ...]
    #: ``(host, port)`` it is ready once it listens on (servers: their Eventer).
    ready_on: tuple[str, int] | None = None

    @property
    def command(self) -> list[str]:
        """The whole command line, with this interpreter."""
        return [sys.executable, "-m", "tidings.cli", *self.arguments]

    @property
    def start_rank(self) -> int:
        return START_RANK[self.kind]

    @property
    def stop_rank(self) -> int:
        return STOP_RANK[self.kind]

    @property
    def stop_grace_s(self) -> float:
        return STOP_GRACE_S[self.kind]


def host_port(address: Address | str) -> tuple[str, int]:
    """``tcp+sbs://HOST:PORT`` or ``HOST:PORT`` as a pair."""
    where = address.partition("://")[2] if "://" in address else address
    host, _, port = where.rpartition(":")
    return host.strip("[]"), int(port)


def parts_of(config: TidingsConfig, path: Path) -> list[Part]:
    """The parts ``config`` (read from ``path``) describes, in start order."""
    file = str(path)
    parts = [
        Part(
            f"server.{name}",
            "server",
            ("server", "-c", file, "--name", name),
            host_port(server.eventer_server.address),
        )
        for name, server in config.servers.items()
    ]
    if config.targets:
        parts.append(Part("relay", "relay", ("relay", "-c", file)))
    if "intermediary" in config.model_fields_set:
        parts.append(Part("intermediary", "intermediary", ("intermediary", "serve", "-c", file)))
    parts.extend(
        Part(
            f"intermediary.{name}",
            "intermediary",
            ("intermediary", "serve", "-c", file, "--name", name),
        )
        for name in config.intermediaries
    )
    return sorted(parts, key=lambda part: part.start_rank)
