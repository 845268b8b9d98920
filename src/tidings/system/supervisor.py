"""``tidings run``: every part of a deployment as a supervised child process.

Each part (:mod:`.parts`) runs in its own process group with its output read line by line
and written to ours with its name in front (``[server.main] ...``), so one terminal shows the
whole deployment and a line says where it came from.

A part that exits while the deployment runs is restarted after a delay that doubles from
:attr:`Supervisor.first_delay_s` up to :attr:`Supervisor.max_delay_s`, and falls back to the
first once the part has stayed up :attr:`Supervisor.stable_after_s`; each restart is logged
(part, exit code, restarts so far, delay). A part that fails at once, again and again
(:attr:`Supervisor.give_up_after` exits in a row within :attr:`Supervisor.quick_exit_s` of its
start, e.g. a refused configuration or a port in use) is not restarted forever: the
supervisor stops the deployment and exits 2 naming the part and its last line.

SIGINT or SIGTERM stops the parts in stop order (intermediaries, the relay, the servers):
SIGTERM to each part's own process, which stops what it started in order (the relay its
Spark query), and after the part's grace period SIGKILL to its whole process group; then
``run`` returns 0.

The supervisor keeps a small state file (:func:`state_path`, JSON, atomically replaced)
that ``tidings status`` reads: its pid, and per part its pid, state, restarts and since when.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from tidings.errors import TidingsError
from tidings.system.parts import Part

log = logging.getLogger(__name__)

PartState = Literal["starting", "up", "waiting", "stopped", "failed"]


def state_path(config_path: Path) -> Path:
    """Where the supervisor of ``config_path`` keeps its state: beside the file."""
    resolved = config_path.resolve()
    return resolved.parent / ".tidings" / f"run-{resolved.stem}.json"


@dataclass
class _Running:
    """A part and its process as the supervisor tracks them."""

    part: Part
    process: subprocess.Popen[bytes] | None = None
    state: PartState = "waiting"
    restarts: int = 0
    quick_exits: int = 0
    started_at: float = 0.0
    since: float = field(default_factory=time.time)
    restart_at: float | None = None
    delay_s: float = 0.0
    last_exit: int | None = None
    last_line: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.part.kind,
            "pid": None if self.process is None else self.process.pid,
            "state": self.state,
            "restarts": self.restarts,
            "since": self.since,
            "last_exit": self.last_exit,
        }


class Supervisor:
    """Runs ``parts`` until stopped; see the module docstring."""

    first_delay_s = 0.5
    max_delay_s = 30.0
    stable_after_s = 60.0
    quick_exit_s = 10.0
    give_up_after = 5
    ready_timeout_s = 60.0

    def __init__(
        self,
        parts: list[Part],
        state_file: Path,
        *,
        output: IO[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self._parts = [_Running(part) for part in parts]
        self._state_file = state_file
        self._output = output or sys.stdout
        self._output_lock = threading.Lock()
        self._env = env
        self._stop = threading.Event()
        self._readers: list[threading.Thread] = []

    def stop(self) -> None:
        """Ask :meth:`run` to stop the deployment (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> int:
        """Start the parts in start order, keep them running until :meth:`stop`, stop them
        in stop order. 0, or 2 when a part kept failing at its start."""
        failure: str | None = None
        try:
            for rank in sorted({r.part.start_rank for r in self._parts}):
                group = [r for r in self._parts if r.part.start_rank == rank]
                for running in group:
                    self._start(running)
                self._wait_ready(group)
            failure = self._watch()
        finally:
            self._stop_all()
            self._write_state(running=False)
        if failure is not None:
            self._say("supervisor", failure)
            return 2
        return 0

    def _watch(self) -> str | None:
        while not self._stop.wait(0.1):
            now = time.monotonic()
            for running in self._parts:
                if running.state == "waiting" and running.restart_at is not None:
                    if now >= running.restart_at:
                        self._start(running)
                    continue
                process = running.process
                if process is None or process.poll() is None:
                    if running.state == "starting" and now - running.started_at > 1.0:
                        self._set(running, "up")
                    continue
                failure = self._exited(running, process.returncode, now)
                if failure is not None:
                    return failure
        return None

    def _exited(self, running: _Running, code: int, now: float) -> str | None:
        """Schedule a restart of a part that exited; a message if it keeps failing."""
        lived = now - running.started_at
        running.last_exit = code
        running.process = None
        running.quick_exits = running.quick_exits + 1 if lived < self.quick_exit_s else 0
        if running.quick_exits >= self.give_up_after:
            self._set(running, "failed")
            return (
                f"{running.part.name} exited {running.quick_exits} times in a row within "
                f"{self.quick_exit_s:g} s of its start (last exit code {code}): "
                f"{running.last_line or 'no output'}; stopping the deployment"
            )
        if lived >= self.stable_after_s:
            running.delay_s = self.first_delay_s
        else:
            running.delay_s = min(self.max_delay_s, max(self.first_delay_s, running.delay_s * 2))
        running.restarts += 1
        running.restart_at = now + running.delay_s
        self._set(running, "waiting")
        log.warning(
            "part exited; restarting it",
            extra={
                "part": running.part.name,
                "exit_code": code,
                "restarts": running.restarts,
                "delay_s": running.delay_s,
            },
        )
        self._say(
            "supervisor",
            f"{running.part.name} exited with code {code}; restart {running.restarts} "
            f"in {running.delay_s:g} s",
        )
        return None

    def _start(self, running: _Running) -> None:
        process = subprocess.Popen(
            running.part.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=self._env,
        )
        running.process = process
        running.started_at = time.monotonic()
        running.restart_at = None
        self._set(running, "starting")
        reader = threading.Thread(
            target=self._copy_output, args=(running, process), daemon=True, name=running.part.name
        )
        reader.start()
        self._readers.append(reader)

    def _copy_output(self, running: _Running, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.strip():
                running.last_line = line.strip()
            self._say(running.part.name, line)

    def _say(self, name: str, line: str) -> None:
        with self._output_lock:
            self._output.write(f"[{name}] {line}\n")
            self._output.flush()

    def _wait_ready(self, group: list[_Running]) -> None:
        """Until each part of ``group`` that names a port listens on it (bounded)."""
        deadline = time.monotonic() + self.ready_timeout_s
        for running in group:
            if running.part.ready_on is None:
                continue
            while not self._stop.is_set() and time.monotonic() < deadline:
                if _listening(*running.part.ready_on):
                    self._set(running, "up")
                    break
                if running.process is not None and running.process.poll() is not None:
                    break  # it exited: the watch loop restarts it
                time.sleep(0.1)

    def _stop_all(self) -> None:
        for rank in sorted({r.part.stop_rank for r in self._parts}):
            group = [r for r in self._parts if r.part.stop_rank == rank]
            for running in group:
                if running.process is not None and running.process.poll() is None:
                    # The part's own process only: it stops what it started (the relay its
                    # Spark query and JVM) in order; the group is killed only after grace.
                    with contextlib.suppress(ProcessLookupError):
                        running.process.send_signal(signal.SIGTERM)
            for running in group:
                self._reap(running)

    def _reap(self, running: _Running) -> None:
        process = running.process
        if process is not None:
            try:
                process.wait(running.part.stop_grace_s)
            except subprocess.TimeoutExpired:
                self._say("supervisor", f"{running.part.name} did not stop in time; killing it")
                _signal_group(process, signal.SIGKILL)
                process.wait(10)
            _signal_group(process, signal.SIGKILL)  # anything it left behind
            running.last_exit = process.returncode
        self._set(running, "stopped")

    def _set(self, running: _Running, state: PartState) -> None:
        running.state = state
        running.since = time.time()
        self._write_state(running=True)

    def _write_state(self, *, running: bool) -> None:
        state = {
            "supervisor_pid": os.getpid() if running else None,
            "updated_at": time.time(),
            "parts": {r.part.name: r.as_json() for r in self._parts},
        }
        self._state_file.parent.mkdir(parents=True, exist_ok=True)
        temporary = self._state_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=2))
        temporary.replace(self._state_file)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def read_state(config_path: Path) -> dict[str, Any] | None:
    """The state the supervisor of ``config_path`` last wrote, None if it never ran here;
    parts are reported down when the supervisor is gone."""
    path = state_path(config_path)
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TidingsError(f"cannot read the supervisor's state {path}: {exc}") from None
    pid = state.get("supervisor_pid")
    alive = isinstance(pid, int) and _alive(pid)
    state["running"] = alive
    for part in state.get("parts", {}).values():
        part["up"] = alive and part.get("state") == "up"
    return state


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def install_stop_signals(stop: Callable[[], None]) -> None:
    """SIGINT and SIGTERM call ``stop`` (the supervisor then stops the parts in order)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop())
