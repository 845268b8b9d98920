"""Running on a Spark cluster: the relay, replay and housekeeping on a real standalone master
with a separate worker (started here, on this host, as the README's section says), and the
configuration file that a task cannot read.

The cluster run happens in a driver process of its own (:func:`drive`): a JVM holds one
SparkContext, and this test process may already hold the suite's local one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.request import urlopen

import pyarrow.parquet as pq
import pyspark
import pytest
import yaml
from pyspark.errors import StreamingQueryException
from sqlalchemy import Engine, func, select

import tidings
from bench.harness.processes import free_port, log_tail, wait_for_port
from tests.support.helpers import relay_config, statuses, store_events, store_target, write_config
from tests.support.waiting import wait_until
from tidings.config import load_config_file
from tidings.db import make_engine
from tidings.errors import ConfigError, RelayError
from tidings.events.timeutil import utcnow
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import batch_log, outbox_event
from tidings.pipeline.housekeeping.run import DELETION_EVENT, run_housekeeping
from tidings.pipeline.jobconfig import MISSING_FILE_PAUSES, job_config, job_options
from tidings.pipeline.relay import run_relay
from tidings.pipeline.replay import ReplayLimits, run_replay
from tidings.pipeline.spark import spark_session

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
#: The tidings under test: the executors must run this very code.
SRC = str(Path(tidings.__file__).resolve().parent.parent)
REPO = str(Path(__file__).resolve().parents[2])
APP = "tidings-cluster-test"
KEYS = ("k0", "k1", "k2")


# --- the configuration file a task cannot read (no Spark needed) ---------------------------------


def _options(tmp_path: Path) -> tuple[dict[str, str], Path]:
    config = relay_config(tmp_path, routes={"A": ["store"]})
    path = write_config(config, tmp_path / "tidings.yaml")
    return job_options(config, str(path)), path


def test_a_missing_configuration_file_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    options, path = _options(tmp_path)
    assert job_config(options).routing.routes == {"A": ["store"]}
    path.unlink()
    started = time.monotonic()
    with pytest.raises(ConfigError) as raised:
        job_config(options)
    assert time.monotonic() - started >= sum(MISSING_FILE_PAUSES)  # it waited for a save
    message = str(raised.value)
    assert str(path) in message
    assert "cannot be read on host" in message
    assert "No such file or directory" in message
    assert "every executor host" in message


def test_an_unreadable_configuration_file_is_an_error(tmp_path: Path) -> None:
    options, path = _options(tmp_path)
    path.unlink()
    path.mkdir()  # there, but not a file (the tests run as root: modes would not stop a read)
    with pytest.raises(ConfigError, match="Is a directory"):
        job_config(options)


def test_a_file_missing_for_a_moment_while_an_editor_saves_is_no_error(tmp_path: Path) -> None:
    options, path = _options(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["routing"]["routes"]["B"] = ["store"]
    backup = path.with_name("tidings.yaml~")
    path.rename(backup)  # vim's way: the old file moved away, then the new one written
    saved = threading.Timer(0.1, lambda: path.write_text(yaml.safe_dump(data)))
    saved.start()
    try:
        assert job_config(options).routing.routes == {"A": ["store"], "B": ["store"]}
    finally:
        saved.join()


@pytest.mark.spark
def test_the_relay_fails_the_batch_when_the_file_goes_missing(spark, tmp_path: Path) -> None:
    """Local mode: the task that cannot read the file is the relay's; it stops with the
    reason instead of routing on with the routes the driver read at start."""
    config = relay_config(tmp_path)
    path = write_config(config, tmp_path / "tidings.yaml")
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    with outbox.transaction() as tx:
        tx.emit("Created", {"i": 0}, partition_key="k")
    stop = threading.Event()

    def remove_the_file_then_emit() -> None:
        try:
            wait_until(lambda: _batches_logged(engine) == 1, timeout=60)  # batch 0 is done
            path.unlink()
            with outbox.transaction() as tx:
                tx.emit("Created", {"i": 1}, partition_key="k")
            stop.wait(60)
        finally:
            stop.set()  # ends a relay that did not fail: pytest.raises then fails the test

    helper = threading.Thread(target=remove_the_file_then_emit, daemon=True)
    helper.start()
    try:
        # (run_relay lets Spark's exception through when the query fails while it waits)
        with pytest.raises((RelayError, StreamingQueryException)) as raised:
            run_relay(spark, config, str(path), stop=stop)
    finally:
        stop.set()
        helper.join(70)
    message = str(raised.value)
    assert f"configuration file {str(path)!r} cannot be read on host" in message
    assert ", in publish_task\n" in message  # a task failed publishing (not the driver's record)
    assert statuses(engine) == {1: "PUBLISHED", 2: "PENDING"}


def _batches_logged(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(batch_log)).scalar_one()


# --- a standalone master and worker on this host --------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    master_url: str
    ui_port: int
    work_dir: Path


def _cluster_state(ui_port: int) -> dict:
    """The master's status as its web UI serves it in JSON."""
    with urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as reply:
        return json.load(reply)


def _worker_states(ui_port: int) -> list[str]:
    """The states of the workers the master knows ([] while its web UI is starting)."""
    try:
        return [worker["state"] for worker in _cluster_state(ui_port)["workers"]]
    except OSError:  # refused, or 404 until the UI's handlers are in place
        return []
    except ValueError:  # an HTML page at /json/ while the UI is still starting (seen once)
        return []


def _spark_daemon(
    kind: str, args: list[str], workdir: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], Path]:
    """``spark-class`` running the standalone ``Master`` or ``Worker``, logging to a file."""
    log = workdir / f"{kind.lower()}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(SPARK_CLASS), f"org.apache.spark.deploy.{kind.lower()}.{kind}", *args],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its group holds what it starts: executors, Python workers
        )
    return proc, log


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the daemon's process group, then SIGKILL whatever of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@contextlib.contextmanager
def standalone_cluster(workdir: Path) -> Iterator[Cluster]:
    """A Spark standalone master and one worker (1 core, 1 GiB) on the loopback, started with
    PySpark's ``spark-class``; both stopped at the end with everything they started.

    The worker's environment puts :data:`SRC` on the executors' Python path, so the
    executors run the tidings under test (an installed tidings otherwise).
    """
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": SRC,
        # no REST submission server: it would take the fixed port 6066
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
    }
    master_port, ui_port, worker_port, worker_ui_port = (free_port() for _ in range(4))
    work_dir = workdir / "work"
    started: list[subprocess.Popen[bytes]] = []
    try:
        master, master_log = _spark_daemon(
            "Master",
            ["--host", "127.0.0.1", "--port", str(master_port), "--webui-port", str(ui_port)],
            workdir,
            env,
        )
        started.append(master)
        wait_for_port(master_port, 90, process=master, log=master_log)
        wait_for_port(ui_port, 90, process=master, log=master_log)
        url = f"spark://127.0.0.1:{master_port}"
        worker, worker_log = _spark_daemon(
            "Worker",
            [
                *("--host", "127.0.0.1", "--port", str(worker_port)),
                *("--webui-port", str(worker_ui_port), "--work-dir", str(work_dir)),
                *("--cores", "1", "--memory", "1g", url),
            ],
            workdir,
            env,
        )
        started.append(worker)
        wait_until(
            lambda: _worker_states(ui_port) == ["ALIVE"],
            90,
            interval=0.5,
            explain=lambda: log_tail(worker_log),
        )
        yield Cluster(url, ui_port, work_dir)
    finally:
        for proc in reversed(started):
            _stop_group(proc)


def _processes_in(directory: Path) -> list[str]:
    """Processes whose working directory is in ``directory`` (what the cluster left)."""
    left = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")).is_relative_to(directory):
                left.append((proc / "cmdline").read_bytes().replace(b"\0", b" ")[:200].decode())
    return left


# --- the driver program, in a process of its own -----------------------------------------------


def _emit(outbox: Outbox, count: int, first: int) -> list[tuple[str, str]]:
    """``count`` events of type Created over :data:`KEYS`: (event id, key) in log order."""
    emitted = []
    for i in range(first, first + count):
        key = KEYS[i % len(KEYS)]
        with outbox.transaction() as tx:
            emitted.append((tx.emit("Created", {"i": i}, partition_key=key), key))
    return emitted


def drive(workdir: str) -> None:
    """The driver: relay, relay during an outage, replay, housekeeping, as ``tidings relay
    --once``, ``replay`` and ``housekeep`` do, on the configuration's Spark master; what it
    saw goes to ``result.json``."""
    work = Path(workdir)
    path = work / "tidings.yaml"
    config = load_config_file(path)
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    spark = spark_session(config.relay, app_name=APP)
    imported = spark.sparkContext.parallelize([0], 1).map(lambda _: tidings.__file__).collect()
    result: dict[str, object] = {
        "master": spark.sparkContext.master,
        "executor_memory": spark.conf.get("spark.executor.memory"),
        "executors_import": imported[0],
    }
    emitted = _emit(outbox, 30, 0)
    run_relay(spark, config, str(path), once=True)
    result["after_relay"] = Counter(statuses(engine).values())
    fault = Path(config.targets["store"].fault_file or "")
    fault.write_text("down")
    emitted += _emit(outbox, 15, 30)
    run_relay(spark, config, str(path), once=True)
    result["after_outage"] = Counter(statuses(engine).values())
    fault.unlink()
    limits = ReplayLimits(timedelta(0), 50, timedelta(minutes=2), 1000)
    result["replay"] = run_replay(spark, config, str(path), limits).as_dict()
    done = run_housekeeping(spark, config, older_than=timedelta(0), now=utcnow() + timedelta(2))
    result["housekeeping"] = [done.deleted, done.archived, done.archive_path]
    result["emitted"] = emitted
    spark.stop()
    (work / "result.json").write_text(json.dumps(result))


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_relay_replay_and_housekeeping_on_a_standalone_cluster(tmp_path: Path, pg_url: str) -> None:
    config = relay_config(
        tmp_path,
        pg_url,
        targets={"store": store_target(tmp_path, fault_file=str(tmp_path / "store.fault"))},
        retry={"backoff": ["1ms"]},
    )
    data = config.model_dump(mode="json")
    data["housekeeping"]["archive_dir"] = str(tmp_path / "archive")
    with standalone_cluster(tmp_path) as cluster:
        data["relay"]["spark_master"] = cluster.master_url
        (tmp_path / "tidings.yaml").write_text(yaml.safe_dump(data))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([SRC, REPO]),
            "SPARK_LOCAL_IP": "127.0.0.1",  # one host: the executors reach the driver here
            # Spark settings tidings does not set, in Spark's own way (spark-defaults.conf
            # in SPARK_CONF_DIR works too)
            "PYSPARK_SUBMIT_ARGS": "--conf spark.executor.memory=512m pyspark-shell",
        }
        env.pop("PYSPARK_PYTHON", None)  # tidings' default: this interpreter
        log = tmp_path / "driver.log"
        with log.open("wb") as out:
            done = subprocess.run(
                [sys.executable, "-c", f"import {__name__} as t; t.drive({str(tmp_path)!r})"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=240,
            )
        assert done.returncode == 0, log_tail(log, 60)
        apps = _cluster_state(cluster.ui_port)["completedapps"]
    assert _processes_in(tmp_path) == []  # master, worker, executors, Python workers: gone

    result = json.loads((tmp_path / "result.json").read_text())
    assert result["master"] == cluster.master_url
    assert result["executor_memory"] == "512m"
    assert result["executors_import"] == tidings.__file__
    assert [app["name"] for app in apps] == [APP]
    # The tasks ran on the worker: its executor's log for this application says so.
    executor_logs = list(cluster.work_dir.glob("app-*/*/stderr"))
    assert len(executor_logs) == 1
    assert "Finished task" in executor_logs[0].read_text()

    assert result["after_relay"] == {"PUBLISHED": 30}
    after_outage = result["after_outage"]
    assert after_outage.pop("PUBLISHED") == 30
    assert sum(after_outage.values()) == 15 and set(after_outage) <= {"HELD", "FAILED"}
    assert result["replay"]["published"] == 15
    deleted, archived, archive_path = result["housekeeping"]
    assert (deleted, archived, archive_path) == (45, 45, str(tmp_path / "archive"))
    engine = make_engine(pg_url)
    with engine.connect() as conn:
        left = conn.execute(select(outbox_event.c.event_type)).scalars().all()
    engine.dispose()
    assert left == [DELETION_EVENT]

    emitted = [(event_id, key) for event_id, key in result["emitted"]]
    archive = pq.read_table(archive_path, columns=["event_id", "status"]).to_pylist()
    assert sorted(row["event_id"] for row in archive) == sorted(e for e, _ in emitted)
    assert {row["status"] for row in archive} == {"PUBLISHED"}
    stored = store_events(load_config_file(tmp_path / "tidings.yaml"))
    delivered = [event.outbox_event_id for event in stored]
    assert sorted(delivered) == sorted(e for e, _ in emitted)  # each exactly once
    for key in KEYS:
        of_key = {e for e, k in emitted if k == key}
        assert [e for e in delivered if e in of_key] == [e for e, k in emitted if k == key]
