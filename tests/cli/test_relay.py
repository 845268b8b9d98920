"""``tidings relay`` as an operator runs it: a subprocess on a SQLite log with the embedded
event store as target. ``--once`` drains, exits 0 and says what it did in one line; SIGTERM
stops a running relay cleanly (exit 0, its summary line); neither leaves an ERROR line or a
stack trace on stderr (the Py4J traces a Spark listener used to print at shutdown)."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import func, select

from bench.harness.processes import kill_tree, tidings_cli
from tests.support.helpers import relay_config, store_events, write_config
from tests.support.waiting import wait_until
from tidings.db import make_engine
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event

pytestmark = [pytest.mark.spark]

#: What stderr of a clean run must not hold.
TRACES = ("ERROR", "Traceback", "Py4JException", "Exception")


def _emit(url: str, count: int, event_type: str = "Created") -> None:
    outbox = Outbox(make_engine(url))
    with outbox.transaction() as tx:
        for i in range(count):
            tx.emit(event_type, {"i": i}, partition_key=f"k{i % 3}")


def _relay(config: Path, workdir: Path, *args: str) -> subprocess.Popen[bytes]:
    return tidings_cli(
        "relay",
        "-c",
        str(config),
        *args,
        stdout=(workdir / "out.txt").open("wb"),
        stderr=(workdir / "err.txt").open("wb"),
        start_new_session=True,  # its own process group: kill_tree reaches the JVM
    )


def _assert_quiet(workdir: Path) -> None:
    stderr = (workdir / "err.txt").read_text()
    assert not [t for t in TRACES if t in stderr], stderr[-4000:]


def test_once_drains_and_ends_with_a_summary(tmp_path: Path) -> None:
    config = relay_config(tmp_path)
    path = write_config(config, tmp_path / "tidings.yaml")
    _emit(config.database.url, 5)
    _emit(config.database.url, 2, "Nope")  # no route: UNROUTABLE
    relay = _relay(path, tmp_path, "--once")
    try:
        assert relay.wait(300) == 0, (tmp_path / "err.txt").read_text()[-3000:]
    finally:
        if relay.poll() is None:
            kill_tree(relay)
    out = (tmp_path / "out.txt").read_text()
    assert re.search(
        r"^relay --once: 7 events read, 5 published \(store 5\), 0 failed, 0 held, "
        r"2 unroutable in \d+\.\d s$",
        out,
        re.M,
    ), out
    _assert_quiet(tmp_path)
    assert len(store_events(config)) == 5


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_running_relay_cleanly(signum: int, tmp_path: Path) -> None:
    """SIGTERM (systemd, Kubernetes) and SIGINT (Ctrl-C) stop it alike: the batch in flight
    commits, the summary counts it, the exit code is 0."""
    config = relay_config(tmp_path)
    path = write_config(config, tmp_path / "tidings.yaml")
    engine = make_engine(config.database.url)
    _emit(config.database.url, 4)
    relay = _relay(path, tmp_path)

    def published() -> bool:
        assert relay.poll() is None, (tmp_path / "err.txt").read_text()[-3000:]
        with engine.connect() as conn:
            query = select(func.count()).where(outbox_event.c.status == "PUBLISHED")
            return conn.execute(query).scalar_one() == 4

    try:
        wait_until(published, timeout=300, interval=0.5)
        relay.send_signal(signum)
        assert relay.wait(120) == 0, (tmp_path / "err.txt").read_text()[-3000:]
    finally:
        if relay.poll() is None:
            kill_tree(relay)
    out = (tmp_path / "out.txt").read_text()
    assert re.search(r"^relay stopped: 4 events read, 4 published \(store 4\)", out, re.M), out
    _assert_quiet(tmp_path)
