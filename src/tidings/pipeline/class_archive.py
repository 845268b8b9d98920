"""The driver JVM's class data sharing archive: Spark's classes mapped at start, not loaded.

Most of a relay's cold start is the driver JVM loading and verifying Spark's classes (the
SparkSession, then the streaming, planning and ``foreachBatch`` code of the first batch),
one by one from the jars. The JVM can instead map them from an archive made by a run that
loaded them (AppCDS, a dynamic archive: ``-XX:ArchiveClassesAtExit`` to make it,
``-XX:SharedArchiveFile`` to use it), which shortened the Spark steps of every start
measured side by side with ``bench/cold_start.py``.

The archive is made once, at setup (``tidings relay --make-class-archive``,
:func:`make_class_archive`), by a relay run in a process of its own on a scratch outbox,
and used by every later start while the file exists (:func:`driver_java_options`). A JVM
that cannot use it (Spark or Java upgraded since) warns and loads its classes as before; a
truncated archive would end the JVM, so it is written beside its place and renamed into it
only once the JVM that wrote it has exited.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tidings.config import RelayConfig, TidingsConfig
from tidings.errors import RelayError

#: How long making the archive may take (a relay's start and drain, and the JVM's dump).
MAKE_TIMEOUT_S = 600.0
_EVENTS = 20
_EVENT_TYPE = "tidings.class_archive"


def driver_java_options(config: RelayConfig) -> str:
    """``relay.driver_java_options``, with the class archive if one is configured and made."""
    archive = config.jvm_class_archive
    if archive is None or not os.path.isfile(archive):
        return config.driver_java_options
    return f"{config.driver_java_options} -XX:SharedArchiveFile={archive}".strip()


def make_class_archive(config: TidingsConfig) -> Path:
    """Make ``relay.jvm_class_archive``: run a relay (``--once``, in a process of its own, on
    a scratch SQLite outbox of a few events and an ``event_store`` target, with this
    configuration's Spark settings) whose driver JVM writes the classes it loaded when it
    exits, then put the archive in its place. Returns its path; a :class:`RelayError` if
    no path is configured or the run did not make it."""
    target = config.relay.jvm_class_archive
    if target is None:
        raise RelayError(
            "relay.jvm_class_archive is not set: give the archive's path in the configuration"
        )
    final = Path(target)
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tidings-class-archive-") as scratch:
        work = Path(scratch)
        made = final.with_name(f"{final.name}.{os.getpid()}.tmp")
        made.unlink(missing_ok=True)
        try:
            _archive_run(config.relay, work, made)
            if not made.is_file() or made.stat().st_size == 0:
                raise RelayError(f"the relay's JVM wrote no class archive ({made})")
            os.replace(made, final)
        finally:
            made.unlink(missing_ok=True)
    return final


def _archive_run(relay: RelayConfig, work: Path, archive: Path) -> None:
    """``tidings relay --once`` on a scratch outbox in ``work``, its driver JVM writing
    ``archive`` at its exit; returns once every process of the run ended."""
    _scratch_outbox(work / "app.db")
    options = f"{relay.driver_java_options} -XX:ArchiveClassesAtExit={archive}".strip()
    config = {
        "database": {"url": "sqlite:///app.db"},
        "targets": {"store": {"kind": "event_store", "url": "sqlite:///events.db"}},
        "routing": {"routes": {_EVENT_TYPE: ["store"]}},
        "relay": {
            "spark_master": relay.spark_master,
            "driver_memory": relay.driver_memory,
            "driver_java_options": options,
            "checkpoint_dir": "checkpoint",
        },
    }
    path = work / "tidings.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    command = [sys.executable, "-m", "tidings.cli", "relay", "--once", "-c", str(path)]
    log_path = work / "relay.log"
    with log_path.open("wb") as out:
        # A session of its own: the JVM outlives the relay's Python process for its dump,
        # and the run is over only once no process of the session is left.
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=work
        )
        deadline = time.monotonic() + MAKE_TIMEOUT_S
        try:
            code = proc.wait(MAKE_TIMEOUT_S)
            while _group_alive(proc.pid):
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(command, MAKE_TIMEOUT_S)
                time.sleep(0.2)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RelayError(f"making the class archive took over {MAKE_TIMEOUT_S:g} s") from None
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise RelayError(f"the relay run that makes the class archive failed:\n{tail}")


def _scratch_outbox(path: Path) -> None:
    """A SQLite outbox with a few events committed, for the archive run's first batch."""
    from tidings.db import make_engine
    from tidings.outbox.producer import Outbox
    from tidings.outbox.schema import ensure_schema

    engine = make_engine(f"sqlite:///{path}")
    try:
        ensure_schema(engine)
        with Outbox(engine).transaction() as tx:
            for i in range(_EVENTS):
                tx.emit(_EVENT_TYPE, {"i": i}, partition_key=f"k{i % 2}")
    finally:
        engine.dispose()


def _group_alive(pgid: int) -> bool:
    """Whether a process of the process group ``pgid`` is still running."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
