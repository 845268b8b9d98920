"""Two ``tidings relay`` processes on one outbox and checkpoint: one publishes, the other
stands by (in its output and in ``tidings status``); SIGKILL the active one while events
flow, and the standby takes over. Every row ends PUBLISHED and every event is stored once,
in per-key order, in the embedded event store (which de-duplicates by outbox event id).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from bench.harness.processes import TIDINGS, kill_tree, tidings_cli
from tests.support.helpers import relay_config, store_events, store_target, write_config
from tests.support.waiting import wait_until
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event

pytestmark = [pytest.mark.slow, pytest.mark.spark]

KEYS = 8


def _relay(config_path: Path, log: Path) -> subprocess.Popen[bytes]:
    return tidings_cli(
        "relay",
        "--config",
        str(config_path),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the JVM dies with it
    )


def _emit(outbox: Outbox, keys: dict[str, str], start: int, count: int) -> None:
    with outbox.transaction() as tx:
        for n in range(start, start + count):
            key = f"k{n % KEYS}"
            keys[tx.emit("Created", {"n": n}, partition_key=key)] = key


def _published(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            select(func.count()).where(outbox_event.c.status == "PUBLISHED")
        ).scalar_one()


def _says(log: Path, text: str) -> bool:
    return text in log.read_text(errors="replace")


def _status(config_path: Path) -> dict:
    """``tidings status --json`` as an operator runs it."""
    command = [*TIDINGS, "status", "--json", "--config", str(config_path)]
    done = subprocess.run(command, capture_output=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_a_standby_relay_takes_over_from_a_killed_one(tmp_path: Path, database_url: str) -> None:
    config = relay_config(
        tmp_path,
        database_url,
        targets={"store": store_target(tmp_path)},
        max_events_per_batch=200,
        replay_every=None,
    )
    config_path = write_config(config, tmp_path / "tidings.yaml")
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    keys: dict[str, str] = {}
    for start in range(0, 300, 50):
        _emit(outbox, keys, start, 50)
    logs = tmp_path / "first.log", tmp_path / "second.log"
    first = _relay(config_path, logs[0])
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_until(
            lambda: _says(logs[0], "relay active"),
            300,
            interval=0.2,
            explain=lambda: logs[0].read_text(),
        )
        second = _relay(config_path, logs[1])
        wait_until(
            lambda: _says(logs[1], "relay standing by"),
            300,
            interval=0.2,
            explain=lambda: logs[1].read_text(),
        )
        status = _status(config_path)["relay_lease"]
        assert f":{first.pid}:" in status["active"]
        assert [f":{second.pid}:" in owner for owner in status["standby"]] == [True]
        wait_until(
            lambda: _published(engine) == 300,
            300,
            interval=0.2,
            explain=lambda: logs[0].read_text()[-3000:],
        )

        # Events keep coming while the active relay dies.
        emitting = threading.Thread(
            target=lambda: [
                (_emit(outbox, keys, n, 10), time.sleep(0.05)) for n in range(300, 600, 10)
            ]
        )
        emitting.start()
        time.sleep(0.5)
        assert not _says(logs[1], "relay active")  # it stood by until now
        kill_tree(first)
        killed = time.monotonic()
        wait_until(
            lambda: _says(logs[1], "relay active"),
            120,
            interval=0.1,
            explain=lambda: logs[1].read_text(),
        )
        took_lease = time.monotonic() - killed
        emitting.join(60)
        wait_until(
            lambda: _published(engine) == 600,
            300,
            interval=0.2,
            explain=lambda: logs[1].read_text()[-3000:],
        )
        print(f"standby took the lease {took_lease:.1f} s after the kill")  # informational
        assert second.poll() is None, logs[1].read_text()[-3000:]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                kill_tree(proc)

    with engine.connect() as conn:
        order = [
            r[0] for r in conn.execute(select(outbox_event.c.event_id).order_by(outbox_event.c.seq))
        ]
        assert (
            conn.execute(
                select(func.count()).where(outbox_event.c.status != "PUBLISHED")
            ).scalar_one()
            == 0
        )
    delivered = [e.outbox_event_id for e in store_events(config)]
    assert len(delivered) == len(order) == 600 and set(delivered) == set(order)  # each once
    rank = {event_id: n for n, event_id in enumerate(order)}
    last: dict[str, int] = {}
    for event_id in delivered:
        assert rank[event_id] > last.get(keys[event_id], -1), "a key's events out of order"
        last[keys[event_id]] = rank[event_id]
