"""A relay process that dies together with the event server it publishes to: the relay that
takes over (a standby, or the same relay restarted) sends the dead server's last events to
the next server first, although its own processes never confirmed them.

Real ``tidings relay`` processes on one outbox (a SQLite file), a two-address
``event_server`` target, and two real ``tidings server`` processes that do not sync each
other (the worst case of a Syncer that had not copied the dead server's last events). The
events the dead relay confirmed come to the new one from the outbox log, counted back from
the last confirmation there: the takeover comes later than ``failover_resend`` after it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.processes import ServerProcess, free_port, kill_tree, tidings_cli
from tests.support.helpers import relay_config, statuses, write_config
from tests.support.server_helpers import server_payloads
from tests.support.waiting import wait_until
from tidings.db import make_engine
from tidings.outbox.producer import Outbox

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.sockets]

KEYS = 8
HALF = 40
WINDOW_S = 4


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """``a`` and ``b``: each on its own store, neither syncing the other."""
    a = ServerProcess.tidings(tmp_path / "a", 1, {"eventer": free_port()})
    b = ServerProcess.tidings(tmp_path / "b", 2, {"eventer": free_port()})
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


def _numbers(server: ServerProcess) -> list[int]:
    return [envelope["data"]["n"] for envelope in server_payloads(server.eventer)]


def _in_key_order(numbers: list[int]) -> None:
    assert len(numbers) == len(set(numbers)), f"an event is stored twice: {numbers}"
    for key in range(KEYS):
        of_key = [n for n in numbers if n % KEYS == key]
        assert of_key == sorted(of_key), f"key k{key} out of order: {of_key}"


@pytest.mark.parametrize("takes_over", ["standby", "restarted"])
def test_the_relay_that_takes_over_resends_what_the_dead_one_confirmed(
    servers: tuple[ServerProcess, ServerProcess], tmp_path: Path, takes_over: str
) -> None:
    a, b = servers
    config = relay_config(
        tmp_path,
        targets={
            "pair": {
                "kind": "event_server",
                "addresses": [a.eventer, b.eventer],
                "type_prefix": ["t"],
                "failover_resend": f"{WINDOW_S}s",
            }
        },
        routes={"Created": ["pair"]},
        replay_every=None,
    )
    path = write_config(config, tmp_path / "tidings.yaml")
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    relays: list[subprocess.Popen[bytes]] = []

    def start(which: int) -> None:
        relays.append(
            tidings_cli(
                "relay",
                "--config",
                str(path),
                stdout=logs[which].open("ab"),
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the JVM dies with it
            )
        )

    def says(which: int, text: str) -> None:
        wait_until(
            lambda: text in logs[which].read_text(errors="replace"),
            300,
            interval=0.2,
            explain=lambda: logs[which].read_text(errors="replace")[-3000:],
        )

    def emit(numbers: range) -> None:
        with outbox.transaction() as tx:
            for n in numbers:
                tx.emit("Created", {"n": n}, partition_key=f"k{n % KEYS}")

    def published(count: int, which: int) -> None:
        wait_until(
            lambda: list(statuses(engine).values()) == ["PUBLISHED"] * count,
            300,
            interval=0.2,
            explain=lambda: logs[which].read_text(errors="replace")[-3000:],
        )

    try:
        emit(range(HALF))
        start(0)
        says(0, "relay active")
        if takes_over == "standby":
            start(1)
            says(1, "relay standing by")
        published(HALF, 0)  # the first relay's workers confirmed them on a
        time.sleep(WINDOW_S + 0.5)  # longer than the window before the takeover
        kill_tree(relays[0])  # the relay and its server die together
        a.kill()
        emit(range(HALF, 2 * HALF))
        if takes_over == "restarted":
            start(1)
        published(2 * HALF, 1)
    finally:
        for relay in relays:
            if relay.poll() is None:
                kill_tree(relay)
    on_b = _numbers(b)
    _in_key_order(on_b)  # the first half ahead of the second in every key, each once
    assert sorted(on_b) == list(range(2 * HALF))
    a.start()
    on_a = _numbers(a)
    _in_key_order(on_a)
    assert sorted(on_a) == list(range(HALF))
    engine.dispose()
