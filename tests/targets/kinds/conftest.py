"""The event_server target's tests' servers."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.processes import ServerProcess, free_port


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Two real ``tidings server`` processes, ``a`` (server 1) and ``b`` (server 2), each on
    its own SQLite file and Eventer port; they do not sync, so what one stores the other has
    only if a client sent it there."""
    servers = []
    for server_id, name in ((1, "a"), (2, "b")):
        servers.append(ServerProcess.tidings(tmp_path / name, server_id, {"eventer": free_port()}))
        servers[-1].start()
    yield servers
    for server in servers:
        server.stop()
