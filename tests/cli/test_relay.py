"""``tidings relay`` as an operator runs it: a subprocess on a SQLite log with the embedded
event store as target. ``--once`` drains, exits 0 and says what it did in one line; SIGTERM
stops a running relay cleanly (exit 0, its summary line); neither leaves an ERROR line or a
stack trace on stderr (the Py4J traces a Spark listener used to print at shutdown)."""

from __future__ import annotations

import json
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


#: The relay's log lines of its start, in the order they come (docs/design/relay.md).
START_STEPS = (
    "relay command started",
    "relay imports loaded",
    "relay configuration loaded",
    "relay spark session up",
    "relay lease taken",
    "relay started",
    "relay first batch planned",
    "relay task worker ready",
    "relay first batch recorded",
)


@pytest.mark.slow
def test_a_relay_on_a_made_class_archive_logs_each_step_of_its_start(tmp_path: Path) -> None:
    """``--make-class-archive`` makes the configured archive; a relay then starts on it
    (``-Xshare:on``: a JVM that could not map it would not start) and logs each step of its
    start, in order, with the seconds since its process started, the task worker's too."""
    archive = tmp_path / "cds" / "spark.jsa"
    config = relay_config(tmp_path, jvm_class_archive=str(archive))
    path = write_config(config, tmp_path / "tidings.yaml")
    made = _relay(path, tmp_path, "--make-class-archive")
    try:
        assert made.wait(600) == 0, (tmp_path / "err.txt").read_text()[-3000:]
    finally:
        if made.poll() is None:
            kill_tree(made)
    assert archive.stat().st_size > 0
    assert list(archive.parent.iterdir()) == [archive]  # nothing left half-made beside it
    strict = relay_config(
        tmp_path,
        jvm_class_archive=str(archive),
        driver_java_options="-XX:TieredStopAtLevel=1 -Xshare:on",
    )
    write_config(strict, path)
    _emit(config.database.url, 3)
    relay = tidings_cli(
        *("--log-level", "INFO", "relay", "--once", "-c", str(path)),
        stdout=(tmp_path / "out.txt").open("wb"),
        stderr=(tmp_path / "err.txt").open("wb"),
        start_new_session=True,
    )
    try:
        assert relay.wait(300) == 0, (tmp_path / "err.txt").read_text()[-3000:]
    finally:
        if relay.poll() is None:
            kill_tree(relay)
    assert len(store_events(config)) == 3
    lines = [
        json.loads(line)
        for line in (tmp_path / "err.txt").read_text().splitlines()
        if line.startswith("{")
    ]
    steps = [line for line in lines if line["msg"] in START_STEPS]
    assert [line["msg"] for line in steps] == list(START_STEPS)
    assert all(line["since_start_s"] >= 0 for line in steps)
    assert steps[-1]["published"] == 3
