"""A part's process as ``tidings run`` holds it: started in a session of its own, its output
copied line by line with its name in front, asked whether it listens, stopped.

Each part leads its own process group, so that a Ctrl-C on the terminal reaches the
supervisor alone (which then stops the parts in order), and a part that does not stop in
time is killed with everything it started (the relay's JVM, Spark's Python workers). On
Linux a part is also told to receive SIGTERM when the supervisor dies, even by SIGKILL
(``PR_SET_PDEATHSIG``): no part outlives its supervisor unwatched, holding its ports.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

import psutil

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """Run in the child between fork and exec. The death signal is tied to the thread that
    forked: the supervisor starts parts from its main thread, which lives as long as it."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Child:
    """One run of a part's command; ``on_line`` gets each line of its output (stdout and
    stderr together, decoded leniently), from a thread of its own."""

    def __init__(
        self,
        command: Sequence[str],
        on_line: Callable[[str], None],
        env: dict[str, str] | None = None,
    ) -> None:
        self.process = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # one foreign call: takes no lock a thread may hold
            env=env,
        )
        self._reader = threading.Thread(target=self._copy, args=(on_line,), daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _copy(self, on_line: Callable[[str], None]) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            on_line(raw.decode("utf-8", "replace").rstrip("\n"))

    def exit_code(self) -> int | None:
        """Its exit code, or None while it runs."""
        return self.process.poll()

    def listens_on(self, port: int) -> bool:
        """Whether it (or a process it started) listens on ``port``: asked of the system
        rather than by connecting, which would be a client of the part (an event server
        records each connection) and would take another process's port for this one's."""
        try:
            root = psutil.Process(self.process.pid)
            for process in [root, *root.children(recursive=True)]:
                for conn in process.net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                        return True
        except psutil.Error:
            pass
        return False

    def terminate(self) -> None:
        """SIGTERM to its own process, which stops what it started in order (the relay its
        Spark query); its group is left alone until :meth:`finish`."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)

    def finish(self, grace_s: float) -> bool:
        """Wait up to ``grace_s`` for it to exit, SIGKILL its group if it has not (True then),
        kill whatever it left behind, and wait until its output is all copied."""
        killed = False
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            killed = True
            self._kill_group()
            self.process.wait(10)
        self._kill_group()  # anything it left behind holds the output pipe open
        self._reader.join(10)
        return killed

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
