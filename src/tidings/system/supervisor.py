"""``tidings run``: every part of a deployment as a supervised child process.

Each part (:mod:`.parts`) runs as a :class:`~.children.Child`: its own process group, its
output written to ours with its name in front (``[server.main] ...``), so one terminal shows
the whole deployment and a line says where it came from.

Start. Servers first; a part of a later rank starts once every earlier part is up (a part
with a port is up once it listens on it, any other once it has run a second), or after
:attr:`Supervisor.ready_timeout_s` at the latest.

Restarts. A part that exits while the deployment runs is started again after a delay that
doubles from :attr:`Supervisor.first_delay_s` up to :attr:`Supervisor.max_delay_s`, and
falls back to the first once the part had stayed up :attr:`Supervisor.stable_after_s`; each
restart is logged (part, exit code, restarts so far, delay). A part that needs a server of
the deployment (:attr:`.parts.Part.needs`) is started again only while that server is up.

Giving up. A part that fails at once, again and again, is not restarted forever: after
:attr:`Supervisor.give_up_after` exits in a row within :attr:`Supervisor.quick_exit_s` of
its start (a port in use, a database it cannot open) the supervisor stops the deployment
and :meth:`Supervisor.run` returns 2 with one line naming the part and its last line. An
exit while a server the part needs was away (an intermediary losing its server) is the
server's failure, not the part's, and does not count.

Stop. SIGINT or SIGTERM stops the parts in stop order (intermediaries, the relay, the
servers): SIGTERM to each part's own process, and after the part's grace period SIGKILL to
its whole group; then :meth:`Supervisor.run` returns 0.

The supervisor keeps a small state file (:mod:`.state`) that ``tidings status`` reads.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from tidings.system.children import Child
from tidings.system.parts import Part
from tidings.system.state import RunFiles, write_state

log = logging.getLogger(__name__)

PartState = Literal["waiting", "starting", "up", "stopping", "stopped", "failed"]


@dataclass
class _Running:
    """A part and its process as the supervisor tracks them."""

    part: Part
    child: Child | None = None
    state: PartState = "waiting"
    restarts: int = 0
    quick_exits: int = 0
    started_at: float = 0.0
    #: Monotonic time since when it is up; None while it is not.
    up_since: float | None = None
    since: float = field(default_factory=time.time)
    #: Monotonic time of its next start; None until it has been started once.
    start_at: float | None = None
    delay_s: float = 0.0
    last_exit: int | None = None
    last_line: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.part.kind,
            "pid": None if self.child is None else self.child.pid,
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
    up_after_s = 1.0
    ready_timeout_s = 60.0
    tick_s = 0.1

    def __init__(
        self,
        parts: list[Part],
        files: RunFiles,
        *,
        output: IO[str] | None = None,
    ) -> None:
        self._parts = [_Running(part) for part in parts]
        self._by_name = {running.part.name: running for running in self._parts}
        self._files = files
        self._output = output or sys.stdout
        self._output_lock = threading.Lock()
        # unbuffered: a part's printed lines reach the terminal as they are written
        self._env = dict(os.environ) | {"PYTHONUNBUFFERED": "1"}
        self._stop = threading.Event()
        self._began = 0.0

    def stop(self) -> None:
        """Ask :meth:`run` to stop the deployment (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> int:
        """Start the parts, keep them running until :meth:`stop`, stop them in stop order.
        0, or 2 when a part kept failing at its start."""
        self._began = time.monotonic()
        self._write_state(running=True)
        failure: str | None = None
        try:
            while failure is None and not self._stop.wait(self.tick_s):
                failure = self._tick(time.monotonic())
        finally:
            self._stop_all()
            self._write_state(running=False)
        if failure is not None:
            log.error("giving up on a part; deployment stopped", extra={"reason": failure})
            self._say("supervisor", failure)
            return 2
        self._say("supervisor", "all parts stopped")
        return 0

    def _tick(self, now: float) -> str | None:
        for running in self._parts:
            child = running.child
            if child is None:
                if running.state == "waiting" and self._may_start(running, now):
                    self._start(running, now)
                continue
            code = child.exit_code()
            if code is not None:
                failure = self._exited(running, code, now)
                if failure is not None:
                    return failure
            elif running.state == "starting" and self._ready(running, child, now):
                self._set(running, "up", now)
        return None

    def _may_start(self, running: _Running, now: float) -> bool:
        if running.start_at is None:  # its first start: after the parts started before it
            earlier = [r for r in self._parts if r.part.start_rank < running.part.start_rank]
            waited_enough = now - self._began >= self.ready_timeout_s
            if not waited_enough and any(r.up_since is None for r in earlier):
                return False
        elif now < running.start_at:
            return False
        return all(self._by_name[name].up_since is not None for name in running.part.needs)

    def _ready(self, running: _Running, child: Child, now: float) -> bool:
        if running.part.ready_on is not None:
            return child.listens_on(running.part.ready_on[1])
        return now - running.started_at >= self.up_after_s

    def _exited(self, running: _Running, code: int, now: float) -> str | None:
        """Schedule the start again of a part that exited; a message if it keeps failing."""
        assert running.child is not None
        running.child.finish(0)  # what it left behind, and its last lines
        running.child = None
        running.last_exit = code
        lived = now - running.started_at
        upstream_left = any(
            (n := self._by_name[name]).up_since is None or n.up_since > running.started_at
            for name in running.part.needs
        )
        if not upstream_left:
            running.quick_exits = running.quick_exits + 1 if lived < self.quick_exit_s else 0
        if running.quick_exits >= self.give_up_after:
            self._set(running, "failed", now)
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
        running.start_at = now + running.delay_s
        self._set(running, "waiting", now)
        log.warning(
            "part exited; restarting it",
            extra={
                "part": running.part.name,
                "exit_code": code,
                "restarts": running.restarts,
                "delay_s": running.delay_s,
            },
        )
        after = f" once {', '.join(running.part.needs)} is up" if upstream_left else ""
        self._say(
            "supervisor",
            f"{running.part.name} exited with code {code}; restart {running.restarts} "
            f"in {running.delay_s:g} s{after}",
        )
        return None

    def _start(self, running: _Running, now: float) -> None:
        running.child = Child(
            running.part.command, lambda line: self._line(running, line), self._env
        )
        running.started_at = now
        running.start_at = now
        self._set(running, "starting", now)

    def _line(self, running: _Running, line: str) -> None:
        if line.strip():
            running.last_line = line.strip()
        self._say(running.part.name, line)

    def _say(self, name: str, line: str) -> None:
        with self._output_lock:
            self._output.write(f"[{name}] {line}\n")
            self._output.flush()

    def _stop_all(self) -> None:
        for rank in sorted({r.part.stop_rank for r in self._parts}):
            group = [r for r in self._parts if r.part.stop_rank == rank and r.child is not None]
            for running in group:
                assert running.child is not None
                running.child.terminate()
                self._set(running, "stopping", time.monotonic())
            for running in group:
                assert running.child is not None
                if running.child.finish(running.part.stop_grace_s):
                    self._say(
                        "supervisor",
                        f"{running.part.name} did not stop within "
                        f"{running.part.stop_grace_s:g} s; killed it",
                    )
                running.last_exit = running.child.exit_code()
                running.child = None
        for running in self._parts:
            if running.state != "failed":
                self._set(running, "stopped", time.monotonic())

    def _set(self, running: _Running, state: PartState, now: float) -> None:
        running.state = state
        running.since = time.time()
        running.up_since = now if state == "up" else None
        self._write_state(running=True)

    def _write_state(self, *, running: bool) -> None:
        write_state(
            self._files,
            {
                "supervisor_pid": os.getpid() if running else None,
                "updated_at": time.time(),
                "parts": {r.part.name: r.as_json() for r in self._parts},
            },
        )


def install_stop_signals(stop: Callable[[], None]) -> None:
    """SIGINT and SIGTERM call ``stop`` (the supervisor then stops the parts in order)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop())
