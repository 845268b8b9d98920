"""A redundant pair of event servers with streams, as child processes: two ``tidings
server`` on their own SQLite files, each the other's static Syncer peer, each serving
stream ``s``; and what the failover tests check of what consumers received."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.harness.processes import free_port, local_address, wait_for_port
from tests.support.child_parts import ChildPart
from tests.support.stream_helpers import call, poll, stream_server_config

#: Events per key in the failover tests' data (``{"k": key, "n": n}``, n from 0 per key).
KEYS = 5
#: Push settings of the pair: small groups, so that what is in flight is small and known.
PUSH = {"max_in_flight": 2, "max_group_events": 20, "group_delay": "5ms"}


@dataclass
class PairServer:
    """One server of the pair: its process, stream URL and stream port."""

    part: ChildPart
    url: str
    port: int


def start_pair(
    work: Path, monitor_port: int | None = None, users: dict[str, Any] | None = None
) -> tuple[PairServer, PairServer]:
    """Start servers 1 and 2, each the other's static Syncer peer, or members of group
    ``event`` of the Monitor on ``monitor_port``; return once both streams accept
    connections (static), or once both have started (Monitor: only the blessed one
    serves its streams). ``users``: stream users both have besides the helpers' own."""
    syncers = {1: free_port(), 2: free_port()}
    servers = []
    for server_id, peer_id in ((1, 2), (2, 1)):
        config = stream_server_config(
            f"sqlite:///{work}/server{server_id}.db", secure_channel=True, push=PUSH
        )
        config["engine"]["server_id"] = server_id
        config["stream_users"] |= users or {}
        config["syncer_server"] = {"address": local_address(syncers[server_id])}
        if monitor_port is None:
            config["syncer_peers"] = [
                {"server_id": peer_id, "address": local_address(syncers[peer_id])}
            ]
        else:
            config["syncer_token"] = "pair"
            config["monitor"] = {
                "name": f"server{server_id}",
                "group": "event",
                "monitor_address": local_address(monitor_port),
            }
        path = work / f"server{server_id}.yaml"
        path.write_text(yaml.safe_dump(config))
        part = ChildPart(f"server{server_id}", ["server", "--conf", str(path)], work)
        port = config["streams"][0]["port"]
        servers.append(PairServer(part, f"http://127.0.0.1:{port}/evt", port))
    for server in servers:
        server.part.start()
    for server in servers:
        assert server.part.proc is not None
        if monitor_port is None:
            wait_for_port(server.port, 30, process=server.part.proc, log=server.part.log)
        else:
            wait_for_port(syncers[int(server.part.name[-1])], 30, process=server.part.proc)
    return servers[0], servers[1]


def serving(server: PairServer) -> bool:
    """Whether the server's streams accept connections now."""
    try:
        socket.create_connection(("127.0.0.1", server.port), 0.2).close()
    except OSError:
        return False
    return True


class Producer:
    """Generates the tests' events over FTN18 ``addEvent``, ``n`` counting per key."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int]] = []

    async def send(self, url: str, count: int) -> None:
        for _ in range(count):
            index = len(self.sent)
            item = (index % KEYS, index // KEYS)
            reply = await call(
                url,
                "futoin.evt.gen:1.1:addEvent",
                {"type": "ORDER", "data": {"k": item[0], "n": item[1]}},
            )
            assert "r" in reply, reply
            self.sent.append(item)


async def stream_count(url: str) -> int:
    """How many events of the stream the server at ``url`` holds (up to 1,000)."""
    reply = await poll(url, "LIVE")  # no last_id: the newest events
    return len(reply["r"])


def items(events: Iterable[dict[str, Any]]) -> list[tuple[int, int]]:
    """The ``(k, n)`` of received events, in the order received."""
    return [(e["data"]["k"], e["data"]["n"]) for e in events]


def check_delivery(received: Sequence[tuple[int, int]], sent: Sequence[tuple[int, int]]) -> int:
    """Assert at least once and in order per key: every sent item was received, and per key
    each item received is either the next new one or one received before (a duplicate sent
    again after a failover); return how many duplicates there were."""
    assert set(received) >= set(sent), f"lost: {sorted(set(sent) - set(received))[:10]}"
    newest: dict[int, int] = {}
    for key, n in received:
        top = newest.get(key, -1)
        assert n <= top + 1, f"key {key}: got n={n} after n={top}: out of order"
        newest[key] = max(top, n)
    return sum(count - 1 for count in Counter(received).values())
