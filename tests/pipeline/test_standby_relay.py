"""Two ``tidings relay`` processes on one outbox and checkpoint: one publishes, the other
stands by (in its output and in ``tidings status``); SIGKILL the active one (or SIGSTOP it
past its lease, then let it go on) while events flow, and the standby takes over. Every row
ends PUBLISHED and every event is stored once, in per-key order, in the embedded event
store (which de-duplicates by outbox event id).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from bench.harness.processes import TIDINGS, kill_tree, tidings_cli
from tests.support.helpers import relay_config, store_events, store_target, write_config
from tests.support.waiting import wait_until
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event

pytestmark = [pytest.mark.slow, pytest.mark.spark]

KEYS = 8


class _Pair:
    """Two relay processes on one configuration, the first active, the second standing by,
    and the events the test emitted (event id -> partition key)."""

    def __init__(self, tmp_path: Path, database_url: str) -> None:
        self.config = relay_config(
            tmp_path,
            database_url,
            targets={"store": store_target(tmp_path)},
            max_events_per_batch=200,
            replay_every=None,
        )
        self.path = write_config(self.config, tmp_path / "tidings.yaml")
        self.engine = make_engine(self.config.database.url)
        self.outbox = Outbox(self.engine)
        self.keys: dict[str, str] = {}
        self.logs = tmp_path / "first.log", tmp_path / "second.log"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, which: int) -> None:
        self.procs.append(
            tidings_cli(
                "relay",
                "--config",
                str(self.path),
                stdout=self.logs[which].open("ab"),
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the JVM dies with it
            )
        )

    def says(self, which: int, text: str, times: int = 1) -> bool:
        return self.logs[which].read_text(errors="replace").count(text) >= times

    def wait_says(self, which: int, text: str, times: int = 1) -> None:
        wait_until(
            lambda: self.says(which, text, times),
            300,
            interval=0.1,
            explain=lambda: self.logs[which].read_text()[-3000:],
        )

    def emit(self, start: int, count: int) -> None:
        with self.outbox.transaction() as tx:
            for n in range(start, start + count):
                key = f"k{n % KEYS}"
                self.keys[tx.emit("Created", {"n": n}, partition_key=key)] = key

    def emitting(self, start: int, stop: int) -> threading.Thread:
        """Events committed ten at a time, every 50 ms, in a thread (started)."""

        def run() -> None:
            for n in range(start, stop, 10):
                self.emit(n, 10)
                time.sleep(0.05)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    def published(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(
                select(func.count()).where(outbox_event.c.status == "PUBLISHED")
            ).scalar_one()

    def wait_published(self, count: int, which: int) -> None:
        wait_until(
            lambda: self.published() == count,
            300,
            interval=0.2,
            explain=lambda: self.logs[which].read_text()[-3000:],
        )

    def status(self) -> dict:
        """``tidings status --json`` as an operator runs it."""
        command = [*TIDINGS, "status", "--json", "--config", str(self.path)]
        done = subprocess.run(command, capture_output=True, timeout=120, check=True)
        return json.loads(done.stdout)

    def running(self) -> None:
        """300 events published by the first relay, the second standing by (and shown so)."""
        for start in range(0, 300, 50):
            self.emit(start, 50)
        self.start(0)
        self.wait_says(0, "relay active")
        self.start(1)
        self.wait_says(1, "relay standing by")
        lease = self.status()["relay_lease"]
        assert f":{self.procs[0].pid}:" in lease["active"]
        assert [f":{self.procs[1].pid}:" in owner for owner in lease["standby"]] == [True]
        self.wait_published(300, 0)

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
            if proc.poll() is None:
                kill_tree(proc)

    def check_each_event_stored_once_in_key_order(self, total: int) -> None:
        with self.engine.connect() as conn:
            order = [
                r[0]
                for r in conn.execute(select(outbox_event.c.event_id).order_by(outbox_event.c.seq))
            ]
            open_rows = conn.execute(
                select(func.count()).where(outbox_event.c.status != "PUBLISHED")
            ).scalar_one()
        assert open_rows == 0
        delivered = [e.outbox_event_id for e in store_events(self.config)]
        assert len(delivered) == len(order) == total and set(delivered) == set(order)
        rank = {event_id: n for n, event_id in enumerate(order)}
        last: dict[str, int] = {}
        for event_id in delivered:
            key = self.keys[event_id]
            assert rank[event_id] > last.get(key, -1), "a key's events out of order"
            last[key] = rank[event_id]


def test_a_standby_relay_takes_over_from_a_killed_one(tmp_path: Path, database_url: str) -> None:
    pair = _Pair(tmp_path, database_url)
    try:
        pair.running()
        emitting = pair.emitting(300, 600)  # events keep coming while the active relay dies
        time.sleep(0.5)
        assert not pair.says(1, "relay active")  # it stood by until now
        kill_tree(pair.procs[0])
        killed = time.monotonic()
        pair.wait_says(1, "relay active")
        took_lease = time.monotonic() - killed
        emitting.join(60)
        pair.wait_published(600, 1)
        print(f"standby took the lease {took_lease:.1f} s after the kill")  # informational
        assert pair.procs[1].poll() is None, pair.logs[1].read_text()[-3000:]
    finally:
        pair.stop()
    pair.check_each_event_stored_once_in_key_order(600)


def test_a_paused_relay_is_fenced_and_stands_by_when_it_wakes(tmp_path: Path) -> None:
    """SIGSTOP the active relay's whole process group for longer than its lease: the standby
    takes over; SIGCONT: the woken relay finds its lease gone, stops its query without
    writing a status or a batch, and stands by in turn."""
    pair = _Pair(tmp_path, f"sqlite:///{tmp_path / 'app.db'}")
    try:
        pair.running()
        emitting = pair.emitting(300, 600)
        time.sleep(0.5)
        os.killpg(pair.procs[0].pid, signal.SIGSTOP)
        pair.wait_says(1, "relay active")
        emitting.join(60)
        os.killpg(pair.procs[0].pid, signal.SIGCONT)
        pair.wait_says(0, "relay standing by")  # it woke up fenced
        pair.emit(600, 100)
        pair.wait_published(700, 1)
        assert [proc.poll() for proc in pair.procs] == [None, None], (
            pair.logs[0].read_text()[-3000:] + pair.logs[1].read_text()[-3000:]
        )
        lease = pair.status()["relay_lease"]
        assert f":{pair.procs[1].pid}:" in lease["active"]
        assert [f":{pair.procs[0].pid}:" in owner for owner in lease["standby"]] == [True]
    finally:
        pair.stop()
    pair.check_each_event_stored_once_in_key_order(700)
