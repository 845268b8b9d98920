"""A deployment's parts as child processes of a test, which crashes them and plays their
supervisor: each ``tidings`` command runs in its own process group (the relay's JVM dies
with it), logs to a file in the test's folder, is SIGKILLed as a crash would kill it, and is
started again on the same files. A part that exits on its own is started again too, and
counted, so that a test can tell the crashes it made from those it did not."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.harness.processes import TIDINGS, kill_tree, log_tail
from tests.support.waiting import wait_until

#: The least pause before a part that exited on its own is started again (a part that
#: cannot start yet, e.g. an intermediary whose event server is down, exits at once).
RESTART_PAUSE = 0.5


class ChildPart:
    """``tidings ARGS`` in ``work``: its output in ``NAME.out`` (a consumer's JSON lines),
    its log in ``NAME.log``."""

    def __init__(
        self, name: str, args: Sequence[str], work: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.args = list(args)
        self.work = work
        self.env = os.environ | {"PYTHONUNBUFFERED": "1"} | dict(env or {})
        self.log = work / f"{name}.log"
        self.out = work / f"{name}.out"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.kills = 0
        #: The exit codes of the times it ended on its own (not by :meth:`kill`).
        self.exits: list[int] = []

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        with self.log.open("ab") as log, self.out.open("ab") as out:
            self.proc = subprocess.Popen(
                [*TIDINGS, *self.args],
                stdout=out,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.work,
                start_new_session=True,
            )
        self.started_at = time.monotonic()

    def kill(self) -> None:
        """SIGKILL it and what it started; it must be running (a crash of a part that had
        already ended would prove nothing)."""
        assert self.proc is not None and self.running, f"{self.name} is not running: {self.tail()}"
        kill_tree(self.proc)
        self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.running:
            kill_tree(self.proc)

    def restart_if_exited(self) -> None:
        """Start it again if it ended on its own, at most every :data:`RESTART_PAUSE` s."""
        if self.proc is None or self.running:
            return
        if time.monotonic() - self.started_at < RESTART_PAUSE:
            return
        self.exits.append(self.proc.returncode)
        self.start()

    def lines(self) -> list[dict[str, Any]]:
        """The JSON lines it printed, in order (a torn last line left out)."""
        found = []
        for line in self.out.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found

    def tail(self) -> str:
        return f"the end of {self.log}:\n{log_tail(self.log)}"


def supervised_wait(
    parts: Sequence[ChildPart],
    predicate: Callable[[], bool],
    timeout: float,
    explain: Callable[[], str] | None = None,
) -> None:
    """:func:`~tests.support.waiting.wait_until` ``predicate``, starting again every part
    that ended on its own meanwhile (as ``tidings run`` would)."""

    def check() -> bool:
        for part in parts:
            part.restart_if_exited()
        return predicate()

    wait_until(check, timeout, interval=0.1, explain=explain)


#: A count that grows as a part moves events, and by how much it must grow to count as moving.
Progress = tuple[Callable[[], int], int]


def wait_moving(parts: Sequence[ChildPart], progress: Sequence[Progress], timeout: float) -> None:
    """Wait until each ``progress`` count has grown by its amount from now, as
    :func:`supervised_wait` does (the parts' logs explain a timeout)."""
    bases = [count() for count, _ in progress]
    supervised_wait(
        parts,
        lambda: all(c() >= b + n for (c, n), b in zip(progress, bases, strict=True)),
        timeout,
        lambda: "\n".join(p.tail() for p in parts),
    )
